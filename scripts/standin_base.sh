#!/usr/bin/env bash
# Builds CI's stand-in for the production base images, which cannot be pulled on machines with
# no registry access: Debian bookworm minbase with Python 3.11 and venv, imported as
# localhost/standin-python:bookworm. This machine's CA bundle (TLS is intercepted here) and a
# pip.conf trusting it are baked in, so that pip inside a build reaches PyPI; none of this goes
# into the production Dockerfiles. Prints the image name.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/engine.sh
image=localhost/standin-python:bookworm
if $ENGINE image exists "$image" 2>/dev/null || $ENGINE image inspect "$image" >/dev/null 2>&1; then
  echo "$image"; exit 0
fi
# The Debian mirror this machine's apt uses for bookworm itself (so a company mirror works too):
# the first URI of a `deb` source whose suites include plain `bookworm`, in deb822 .sources files
# or one-line sources.list entries (or in the files given). Empty when there is none: debootstrap
# then uses its default.
apt_mirror() {
  local files=("$@")
  [ $# -gt 0 ] || files=(/etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list)
  awk '
    FNR == 1 || /^[[:space:]]*$/ { types = ""; uris = ""; suites = "" }
    /^Types:/ { types = $0 } /^URIs:/ { uris = $2 } /^Suites:/ { suites = $0 }
    types ~ /(^|[ :])deb( |$)/ && uris != "" && (" " suites " ") ~ / bookworm / { print uris; exit }
    /^deb[[:space:]]/ {
      sub(/\[[^]]*\][[:space:]]*/, "")
      if ($3 == "bookworm") { print $2; exit }
    }' "${files[@]}" 2>/dev/null | head -n 1
}
mirror=$(apt_mirror)
rootfs="$IMAGES_WORK/standin-rootfs"
rm -rf "$rootfs"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" \
  ${mirror:+"$mirror"} >"$IMAGES_WORK/debootstrap.log" 2>&1 \
  || { tail -20 "$IMAGES_WORK/debootstrap.log" >&2; exit 1; }
cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$rootfs/etc/pip.conf"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | $ENGINE import - "$image" >/dev/null
rm -rf "$rootfs"
echo "$image"
