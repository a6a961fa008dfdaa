"""Which machine a benchmark ran on, for every figure it prints: figures from two CPU kinds must
never be compared unlabelled."""

from __future__ import annotations

import platform
import re


def cpu_model() -> str:
    """The CPU's name and the vector extensions that decide these figures, from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            text = cpuinfo.read()
    except OSError:
        return platform.processor() or "unknown CPU"
    name = next(iter(re.findall(r"^model name\s*:\s*(.+)$", text, re.M)), "unknown CPU").strip()
    family = re.search(r"^cpu family\s*:\s*(\d+)$", text, re.M)
    model = re.search(r"^model\s*:\s*(\d+)$", text, re.M)
    if family and model:  # VMs often name only the brand; family 25 is AMD Zen 3/4, 26 Zen 5
        name += f" (family {family.group(1)}, model {model.group(1)})"
    flags = set(next(iter(re.findall(r"^flags\s*:\s*(.+)$", text, re.M)), "").split())
    shown = [flag for flag in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if flag in flags]
    return f"{name}: {' '.join(shown) or 'no AVX2'}"
