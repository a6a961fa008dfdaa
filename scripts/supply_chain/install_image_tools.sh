#!/usr/bin/env bash
# Installs the daemonless container tools (Debian/Ubuntu, as root) used when no Docker daemon
# answers: podman and buildah to build and run (catatonit for --init, the dnsname plugin so that
# containers on one network find each other by name), skopeo to inspect, debootstrap for CI's stand-in
# base image, docker-registry for a local registry, curl to ask the podman API service whether it
# is up, fuse3 for the /gcs/ files of a local Vertex rehearsal (scripts/rehearsal/gcs_fuse.py). A no-op when
# they are all there.
set -euo pipefail
needed=(podman buildah runc skopeo debootstrap docker-registry catatonit golang-github-containernetworking-plugin-dnsname curl fuse3)
missing=()
for package in "${needed[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "install_image_tools: need root to apt-get install ${missing[*]}" >&2
  exit 2
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" fuse-overlayfs uidmap >/dev/null
echo "install_image_tools: installed ${missing[*]}"
