#!/usr/bin/env bash
# Run as root by every image's Dockerfile once its system packages are final (docs/images.md#no-tool-
# the-job-does-not-need): removes the base interpreter's packaging tools and ensurepip's bundled
# wheels, then every setuid and setgid bit, and checks that none is left.
#
# The official python images install pip (and, below 3.12, setuptools, which vendors wheel and
# jaraco.context) into /usr/local and keep ensurepip's wheels; none of them runs in a job, and each
# has had advisories (docs/images.md lists them). The images' venv keeps its own pip, at the newest
# release (images/pip.lock). Files dpkg owns are left alone, so the OS SBOM stays true.
set -euo pipefail
python=/usr/local/bin/python3
stdlib=$("$python" -I -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
site=$("$python" -I -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
rm -rf "$site"/pip "$site"/pip-*.dist-info "$site"/setuptools "$site"/setuptools-*.dist-info \
       "$site"/pkg_resources "$site"/_distutils_hack "$site"/distutils-precedence.pth \
       "$site"/wheel "$site"/wheel-*.dist-info "$stdlib"/ensurepip/_bundled/*.whl \
       /usr/local/bin/pip /usr/local/bin/pip3* /usr/local/bin/wheel
left=$("$python" -I -c 'import importlib.util as u; print(*[m for m in ("pip", "setuptools", "wheel") if u.find_spec(m)])')
[ -z "$left" ] || { echo "strip_tools: still importable from $python: $left" >&2; exit 1; }
# No setuid or setgid file: a job never changes user, and such a file is how a process would.
find / -xdev -type f -perm /6000 -exec chmod ug-s {} +
left=$(find / -xdev -type f -perm /6000)
[ -z "$left" ] || { echo "strip_tools: setuid or setgid still set on: $left" >&2; exit 1; }
