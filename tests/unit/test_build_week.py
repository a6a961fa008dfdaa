"""One week of OS updates for every image a run builds: images.sh takes the ISO week at each build
when OS_UPDATES is unset, and a run that crossed Monday 00:00 UTC built its later images on the
new week, from the OS layer up (tests/container/test_images.py's trainer-only rebuild then found
no cached dependency layer and failed). scripts/test.sh fixes the week before its background
builds, and tests/conftest.py before xdist starts the workers, for a run started with pytest."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def test_the_workers_inherit_the_runs_week():
    assert re.fullmatch(r"\d{4}-W\d{2}", os.environ.get("OS_UPDATES", "")), os.environ.get("OS_UPDATES")


def test_the_script_fixes_the_week_before_it_builds_anything():
    script = (REPO / "scripts" / "test.sh").read_text()
    fixed = script.index("export OS_UPDATES=${OS_UPDATES:-$(date -u +%G-W%V)}")
    assert fixed < script.index("step images-in-background prebuild_images")
    assert fixed < script.index("-m pytest")
