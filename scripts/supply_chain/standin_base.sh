#!/usr/bin/env bash
# Builds CI's stand-in for the production base images, which cannot be pulled on machines with no
# registry access, laid out as docker-library's python:3.11-slim images are: Debian bookworm minbase
# with the runtime libraries python.org's build links, and a python.org CPython (this machine's own,
# PYTHON or python3.11, copied from its installation prefix) in /usr/local, no Debian python3. As the
# official images do, `python3 -m ensurepip` then puts pip and setuptools into /usr/local's
# site-packages from ensurepip's bundled wheels, which stay in place: what the Dockerfiles must
# remove from the production bases is in the stand-in too, so the tests see it go. This machine's
# CA bundle (TLS is intercepted here) and a pip.conf trusting it are baked in, so that pip inside a
# build reaches PyPI; none of this goes into the production Dockerfiles.
# Imported as localhost/standin-python:3.11-bookworm-HASH (HASH: this script's, so a changed
# layout is a new image). Prints the image name.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/supply_chain/engine.sh
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
minor=$(sed -n 's/^ARG PYTHON_MINOR=//p' Dockerfile.cpu)
image="localhost/standin-python:${minor}-bookworm-$(sha256sum scripts/supply_chain/standin_base.sh | cut -c1-12)"
have_image() { $ENGINE image exists "$image" 2>/dev/null || $ENGINE image inspect "$image" >/dev/null 2>&1; }
if have_image; then
  echo "$image"; exit 0
fi
# One build at a time, and a caller that waited takes the one just made: scripts/test.sh's
# background builds, the container tier's fixture and a Cloud Build rehearsal's stand-ins each ask
# for this image, and all of them build in the same $IMAGES_WORK/standin-rootfs. (Unlocked, a
# Cloud Build rehearsal's debootstrap found its packages gone: the background build, finishing in
# the same folder, had removed them.)
exec {lock}>"$IMAGES_WORK/standin-base.lock"
flock "$lock"
if have_image; then
  echo "$image"; exit 0
fi
# The interpreter's installation prefix: a python.org build installed under a prefix of its own
# (pyenv's, /usr/local, /opt/python), which copies whole; Debian's /usr python3 does not.
read -r prefix version < <("$PYTHON" -c 'import sys; print(sys.base_prefix, "%d.%d" % sys.version_info[:2])')
if [ "$version" != "$minor" ] || [ "$prefix" = /usr ] || [ ! -x "$prefix/bin/python$minor" ]; then
  echo "standin_base: needs a python.org Python $minor installed under a prefix of its own (PYTHON=/path/to/python$minor); $PYTHON is $version in $prefix" >&2
  exit 2
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
# The runtime libraries the official slim image keeps for its interpreter (OpenSSL, libffi, SQLite,
# bzip2, xz, zlib, ncurses, readline, gdbm, Berkeley DB, libuuid; libnsl and libtirpc for nis), its
# CA bundle, netbase and tzdata: Dockerfile.gpu's list, which its build checks with ldd.
libraries=ca-certificates,netbase,tzdata,libssl3,libffi8,libsqlite3-0,libbz2-1.0,liblzma5,zlib1g,libncursesw6,libtinfo6,libreadline8,libgdbm6,libgdbm-compat4,libdb5.3,libuuid1,libnsl2,libtirpc3
debootstrap --variant=minbase --include="$libraries" bookworm "$rootfs" ${mirror:+"$mirror"} \
  >"$IMAGES_WORK/debootstrap.log" 2>&1 || { tail -20 "$IMAGES_WORK/debootstrap.log" >&2; exit 1; }
# The interpreter, its shared library and its standard library (not what this machine installed
# into its site-packages) into /usr/local, with the official image's names, less what the official
# image's build deletes: every test, tests and idle_test folder, the static libpython*.a (44 MB)
# and compiled bytecode (docker-library/python's Dockerfile, `find /usr/local -depth ... -exec rm`).
mkdir -p "$rootfs/usr/local/bin" "$rootfs/usr/local/lib"
cp -a "$prefix/bin/python$minor" "$rootfs/usr/local/bin/"
cp -a "$prefix"/lib/libpython"$minor"*.so* "$rootfs/usr/local/lib/"
tar -C "$prefix/lib" --exclude="python$minor/site-packages/*" --exclude=test --exclude=tests --exclude=idle_test \
  --exclude='libpython*.a' --exclude='__pycache__' --exclude='*.pyc' -c "python$minor" | tar -C "$rootfs/usr/local/lib" -x
for name in python3 python; do ln -s "python$minor" "$rootfs/usr/local/bin/$name"; done
chroot "$rootfs" /sbin/ldconfig
# pip and setuptools from ensurepip's bundled wheels, as the official images' build installs them.
chroot "$rootfs" /usr/local/bin/python3 -m ensurepip --default-pip >"$IMAGES_WORK/ensurepip.log" 2>&1 \
  || { tail -20 "$IMAGES_WORK/ensurepip.log" >&2; exit 1; }
find "$rootfs/usr/local" -depth -name __pycache__ -exec rm -rf {} +
cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$rootfs/etc/pip.conf"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | $ENGINE import --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$image" >/dev/null
rm -rf "$rootfs"
echo "$image"
