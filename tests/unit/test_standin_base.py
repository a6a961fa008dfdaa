"""scripts/supply_chain/standin_base.sh takes the Debian mirror from the machine's apt configuration."""

import subprocess

import pytest

from helpers import REPO

DEB822 = """Types: deb
Suites: bookworm-security
URIs: http://security.example/debian-security

Types: deb deb-src
Components: main
Suites: bookworm bookworm-updates
URIs: http://mirror.example/debian
"""
ONE_LINE = """# deb http://commented.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://corp.example/debian bookworm main
deb http://corp.example/debian-security bookworm-security main
"""


def apt_mirror(*files) -> str:
    script = f"source <(sed -n '/^apt_mirror()/,/^}}/p' {REPO}/scripts/supply_chain/standin_base.sh); apt_mirror \"$@\""
    return subprocess.run(["bash", "-c", script, "apt_mirror", *map(str, files)], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.parametrize("name, text, mirror", [
    ("debian.sources", DEB822, "http://mirror.example/debian"),
    ("sources.list", ONE_LINE, "http://corp.example/debian"),
    ("empty.list", "", ""),
])
def test_the_mirror_is_the_one_apt_uses_for_bookworm(tmp_path, name, text, mirror):
    (tmp_path / name).write_text(text)
    assert apt_mirror(tmp_path / name) == mirror
