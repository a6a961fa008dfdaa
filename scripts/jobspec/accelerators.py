"""The one table of the machines Vertex AI trains on: for each machine type, the GPUs it takes and
how many, its CPU architecture and the boot disks it can have; for each GPU, its compute capability
and whether it can still be had. `check_machine` turns a request into one line when Vertex AI (or
the image) would refuse it, and `gpu_warnings` says what the image's TensorFlow costs on a GPU,
from the wheel's own list of kernel architectures (images/gpu/tensorflow-build-info.json, written
by scripts/supply_chain/tensorflow_build_info.py from the pinned wheel).

Sources, read in November 2026:
[compute]   Vertex AI, "Configure compute resources for serverless training" (machine types, the
            GPU compatibility table, boot disk options):
            https://cloud.google.com/vertex-ai/docs/training/configure-compute
[cc]        NVIDIA, "CUDA GPUs - Compute Capability": https://developer.nvidia.com/cuda-gpus
[k80]       Compute Engine, "NVIDIA K80 end of support": https://cloud.google.com/compute/docs/eol/k80-eol
[p100]      Compute Engine, "NVIDIA P100 end of support" (shut down 2026-09-15; release notes of
            2026-09-22): https://cloud.google.com/compute/docs/eol/p100-eos
[t4p4]      Compute Engine release notes of 2026-09-22: T4 and P4 deprecated, end of support
            2027-08-01: https://cloud.google.com/compute/docs/eol/t4-eos,
            https://cloud.google.com/compute/docs/eol/p4-eos
[a4x]       Vertex AI training clusters, "Compute resources" (A4X: Arm CPUs, images built for Arm):
            https://cloud.google.com/vertex-ai/docs/training/training-clusters/compute-resources
[disks]     Compute Engine, "About Hyperdisk", machine type support, and the accelerator-optimized
            machine family page: https://cloud.google.com/compute/docs/disks/hyperdisks#machine-type-support,
            https://cloud.google.com/compute/docs/accelerator-optimized-machines
[dws]       Vertex AI, "Schedule training jobs based on resource availability":
            https://cloud.google.com/vertex-ai/docs/training/schedule-jobs-dws
[jit]       TensorFlow issues #60739 and #62320: on a GPU the wheel has only PTX for, start-up
            JIT-compiles every kernel, "30 minutes or longer".
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re

BUILD_INFO_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                               "images", "gpu", "tensorflow-build-info.json")

X86_64, ARM64 = "x86_64", "arm64"
PD_SSD, PD_STANDARD, HYPERDISK_BALANCED = "pd-ssd", "pd-standard", "hyperdisk-balanced"
# Vertex's boot disk types [compute]; a size between 100 and 64,000 GB, 100 by default.
BOOT_DISK_TYPES = (PD_SSD, PD_STANDARD, HYPERDISK_BALANCED)
BOOT_DISK_GB = (100, 64_000)


class AcceleratorError(ValueError):
    """A machine, GPU or count Vertex AI (or the image) would refuse. str() is one line."""


@dataclasses.dataclass(frozen=True)
class Gpu:
    name: str  # Vertex's acceleratorType
    model: str
    compute_capability: tuple[int, int]  # [cc]
    flex_start: bool = False  # Dynamic Workload Scheduler takes it [dws]
    retired: str | None = None  # why it can no longer be requested
    deprecated: str | None = None  # when it will be retired


@dataclasses.dataclass(frozen=True)
class Machine:
    name: str
    gpus: dict[str, tuple[int, ...]]  # accelerator type -> the counts Vertex accepts
    boot_disks: tuple[str, ...]  # the first is the default
    cpu: str = X86_64

    @property
    def requires_gpus(self) -> bool:
        """A2, A3, A4, G2 and G4 machines come with their GPUs: the spec must name them [compute]."""
        return bool(self.gpus) and not self.name.startswith("n1-")


# Retired and deprecated: [k80], [p100], [t4p4]; capabilities [cc]; Dynamic Workload Scheduler [dws].
GPUS = {gpu.name: gpu for gpu in (
    Gpu("NVIDIA_TESLA_K80", "Tesla K80", (3, 7),
        retired="Compute Engine ended its support on 2024-05-01 (cloud.google.com/compute/docs/eol/k80-eol) and "
                "Vertex AI's training table no longer lists it"),
    Gpu("NVIDIA_TESLA_P100", "Tesla P100", (6, 0),
        retired="Compute Engine shut P100 GPUs down on 2026-09-15 (cloud.google.com/compute/docs/eol/p100-eos)"),
    Gpu("NVIDIA_TESLA_P4", "Tesla P4", (6, 1),
        deprecated="Compute Engine ends its support on 2027-08-01 (cloud.google.com/compute/docs/eol/p4-eos)"),
    Gpu("NVIDIA_TESLA_T4", "Tesla T4", (7, 5),
        deprecated="Compute Engine ends its support on 2027-08-01 (cloud.google.com/compute/docs/eol/t4-eos)"),
    Gpu("NVIDIA_TESLA_V100", "Tesla V100", (7, 0)),
    Gpu("NVIDIA_TESLA_A100", "A100 40GB", (8, 0), flex_start=True),
    Gpu("NVIDIA_A100_80GB", "A100 80GB", (8, 0), flex_start=True),
    Gpu("NVIDIA_L4", "L4", (8, 9), flex_start=True),
    Gpu("NVIDIA_H100_80GB", "H100 80GB", (9, 0), flex_start=True),
    Gpu("NVIDIA_H100_MEGA_80GB", "H100 80GB (A3 Mega)", (9, 0), flex_start=True),
    Gpu("NVIDIA_H200_141GB", "H200 141GB", (9, 0), flex_start=True),
    Gpu("NVIDIA_B200", "B200", (10, 0), flex_start=True),
    Gpu("NVIDIA_GB200", "GB200 (Grace Blackwell)", (10, 0)),
    Gpu("NVIDIA_RTX_PRO_6000", "RTX PRO 6000 Blackwell Server Edition", (12, 0)),
)}

# Boot disks [compute][disks]: A3 Ultra, A4, A4X, G4 and N4 take Hyperdisk only (Vertex's default on
# A3 Ultra and A4 is hyperdisk-balanced); N1, N2, E2, C2, A2 and G2 take no Hyperdisk Balanced.
PERSISTENT_ONLY = (PD_SSD, PD_STANDARD)
HYPERDISK_ONLY = (HYPERDISK_BALANCED,)
ANY_DISK = (PD_SSD, PD_STANDARD, HYPERDISK_BALANCED)


def _n1(p4, p100, t4, v100) -> dict[str, tuple[int, ...]]:
    """An N1 row of the GPU compatibility table [compute]: the counts of each GPU it takes."""
    counts = {"NVIDIA_TESLA_P4": p4, "NVIDIA_TESLA_P100": p100, "NVIDIA_TESLA_T4": t4, "NVIDIA_TESLA_V100": v100}
    return {gpu: tuple(n) for gpu, n in counts.items() if n}


def _one(gpu: str, count: int) -> dict[str, tuple[int, ...]]:
    return {gpu: (count,)}


_SMALL, _MID, _LARGE = (1, 2, 4), (2, 4), (4,)
_MACHINES = [
    # Accelerator-optimized machines: the GPUs come with the machine, one count each [compute].
    Machine("a4x-highgpu-4g", _one("NVIDIA_GB200", 4), HYPERDISK_ONLY, cpu=ARM64),  # NVIDIA Grace (Arm) CPUs [a4x]
    Machine("a4-highgpu-8g", _one("NVIDIA_B200", 8), HYPERDISK_ONLY),
    Machine("a3-ultragpu-8g", _one("NVIDIA_H200_141GB", 8), HYPERDISK_ONLY),
    Machine("a3-megagpu-8g", _one("NVIDIA_H100_MEGA_80GB", 8), ANY_DISK),
    *(Machine(f"a3-highgpu-{n}g", _one("NVIDIA_H100_80GB", n), ANY_DISK) for n in (1, 2, 4, 8)),
    *(Machine(f"a2-ultragpu-{n}g", _one("NVIDIA_A100_80GB", n), PERSISTENT_ONLY) for n in (1, 2, 4, 8)),
    *(Machine(f"a2-highgpu-{n}g", _one("NVIDIA_TESLA_A100", n), PERSISTENT_ONLY) for n in (1, 2, 4, 8)),
    Machine("a2-megagpu-16g", _one("NVIDIA_TESLA_A100", 16), PERSISTENT_ONLY),
    *(Machine(f"g2-standard-{vcpus}", _one("NVIDIA_L4", n), PERSISTENT_ONLY)
      for vcpus, n in ((4, 1), (8, 1), (12, 1), (16, 1), (24, 2), (32, 1), (48, 4), (96, 8))),
    *(Machine(f"g4-standard-{vcpus}", _one("NVIDIA_RTX_PRO_6000", n), HYPERDISK_ONLY)
      for vcpus, n in ((48, 1), (96, 2), (192, 4), (384, 8))),
    # N1 with attached GPUs: P4, P100, T4, V100 columns of the table [compute].
    Machine("n1-standard-4", _n1(_SMALL, _SMALL, _SMALL, (1, 2, 4, 8)), PERSISTENT_ONLY),
    Machine("n1-standard-8", _n1(_SMALL, _SMALL, _SMALL, (1, 2, 4, 8)), PERSISTENT_ONLY),
    Machine("n1-standard-16", _n1(_SMALL, _SMALL, _SMALL, (2, 4, 8)), PERSISTENT_ONLY),
    Machine("n1-standard-32", _n1(_MID, _MID, _MID, (4, 8)), PERSISTENT_ONLY),
    Machine("n1-standard-64", _n1(_LARGE, (), _LARGE, (8,)), PERSISTENT_ONLY),
    Machine("n1-standard-96", _n1(_LARGE, (), _LARGE, (8,)), PERSISTENT_ONLY),
    *(Machine(f"n1-highmem-{vcpus}", _n1(_SMALL, _SMALL, _SMALL, (1, 2, 4, 8)), PERSISTENT_ONLY) for vcpus in (2, 4, 8)),
    Machine("n1-highmem-16", _n1(_SMALL, _SMALL, _SMALL, (2, 4, 8)), PERSISTENT_ONLY),
    Machine("n1-highmem-32", _n1(_MID, _MID, _MID, (4, 8)), PERSISTENT_ONLY),
    Machine("n1-highmem-64", _n1(_LARGE, (), _LARGE, (8,)), PERSISTENT_ONLY),
    Machine("n1-highmem-96", _n1(_LARGE, (), _LARGE, (8,)), PERSISTENT_ONLY),
    Machine("n1-highcpu-16", _n1(_SMALL, _SMALL, _SMALL, (2, 4, 8)), PERSISTENT_ONLY),
    Machine("n1-highcpu-32", _n1(_MID, _MID, _MID, (4, 8)), PERSISTENT_ONLY),
    Machine("n1-highcpu-64", _n1(_LARGE, _LARGE, _LARGE, (8,)), PERSISTENT_ONLY),
    Machine("n1-highcpu-96", _n1(_LARGE, (), _LARGE, (8,)), PERSISTENT_ONLY),
    # Machines without GPUs [compute].
    *(Machine(f"e2-standard-{n}", {}, PERSISTENT_ONLY) for n in (4, 8, 16, 32)),
    *(Machine(f"e2-highmem-{n}", {}, PERSISTENT_ONLY) for n in (2, 4, 8, 16)),
    *(Machine(f"e2-highcpu-{n}", {}, PERSISTENT_ONLY) for n in (16, 32)),
    *(Machine(f"n4-{kind}-{n}", {}, HYPERDISK_ONLY)
      for kind in ("standard", "highmem", "highcpu") for n in (2, 4, 8, 16, 32, 48, 64, 80)),
    *(Machine(f"n2-standard-{n}", {}, PERSISTENT_ONLY) for n in (4, 8, 16, 32, 48, 64, 80)),
    *(Machine(f"n2-highmem-{n}", {}, PERSISTENT_ONLY) for n in (2, 4, 8, 16, 32, 48, 64, 80)),
    *(Machine(f"n2-highcpu-{n}", {}, PERSISTENT_ONLY) for n in (16, 32, 48, 64, 80)),
    *(Machine(f"c2-standard-{n}", {}, PERSISTENT_ONLY) for n in (4, 8, 16, 30, 60)),
    *(Machine(name, {}, ANY_DISK) for name in ("m1-ultramem-40", "m1-ultramem-80", "m1-ultramem-160", "m1-megamem-96")),
]
MACHINES = {machine.name: machine for machine in _MACHINES}


def _counts(counts: tuple[int, ...]) -> str:
    text = [str(n) for n in counts]
    return text[0] if len(text) == 1 else ", ".join(text[:-1]) + " or " + text[-1]


def machine(name: str) -> Machine:
    if name not in MACHINES:
        raise AcceleratorError(f"machine type {name} is not one Vertex AI offers for serverless training "
                               "(its configure-compute page; scripts/jobspec/accelerators.py holds the table)")
    return MACHINES[name]


def check_machine(machine_type: str, accelerator_type: str | None, accelerator_count: int) -> Machine:
    """The machine, when Vertex AI takes it with these GPUs and the images can run there; else
    AcceleratorError with one line."""
    spec = machine(machine_type)
    if spec.cpu != X86_64:
        raise AcceleratorError(f"machine type {machine_type} has {spec.cpu} CPUs (NVIDIA Grace); the images are "
                               f"built for x86_64 (linux/amd64) and cannot run there")
    if accelerator_type is None:
        if spec.requires_gpus:
            [(gpu, counts)] = spec.gpus.items()
            raise AcceleratorError(f"machine type {machine_type} comes with {_counts(counts)} {gpu}: give "
                                   f"--accelerator-type {gpu} --accelerator-count {counts[0]}")
        return spec
    gpu = GPUS.get(accelerator_type)
    if gpu is None:
        raise AcceleratorError(f"--accelerator-type {accelerator_type} is not a GPU Vertex AI trains on "
                               f"(known: {', '.join(sorted(g for g in GPUS if not GPUS[g].retired))})")
    if gpu.retired:
        raise AcceleratorError(f"{accelerator_type} is retired: {gpu.retired}; choose another GPU")
    if accelerator_type not in spec.gpus:
        takes = ", ".join(sorted(spec.gpus)) if spec.gpus else "no GPUs"
        raise AcceleratorError(f"machine type {machine_type} cannot take {accelerator_type} (it takes {takes})")
    counts = spec.gpus[accelerator_type]
    if accelerator_count not in counts:
        raise AcceleratorError(f"machine type {machine_type} takes {_counts(counts)} {accelerator_type}, "
                               f"not {accelerator_count}")
    if kernel_support(gpu.compute_capability, build_info().architectures)[0] == UNSUPPORTED:
        raise AcceleratorError(f"{accelerator_type} (compute capability {_cc(gpu)}): the image's TensorFlow "
                               f"{build_info().version} has no kernels it can run there (it has "
                               f"{', '.join(build_info().architectures)})")
    return spec


def check_boot_disk(machine_type: str, disk_type: str | None, size_gb: int | None) -> None:
    spec = machine(machine_type)
    if disk_type is not None and disk_type not in spec.boot_disks:
        raise AcceleratorError(f"--boot-disk-type {disk_type}: machine type {machine_type} boots only from "
                               f"{' or '.join(spec.boot_disks)}")
    if size_gb is not None and not BOOT_DISK_GB[0] <= size_gb <= BOOT_DISK_GB[1]:
        raise AcceleratorError(f"--boot-disk-size-gb must be between {BOOT_DISK_GB[0]} and {BOOT_DISK_GB[1]}, "
                               f"got {size_gb}")


# --- what the image's TensorFlow can run -------------------------------------------------------

NATIVE, JIT, UNSUPPORTED = "native", "jit", "unsupported"


@dataclasses.dataclass(frozen=True)
class BuildInfo:
    version: str  # the tensorflow wheel's version
    architectures: tuple[str, ...]  # cuda_compute_capabilities: sm_XY (machine code), compute_XY (PTX)


@functools.lru_cache(maxsize=None)
def build_info(path: str = BUILD_INFO_FILE) -> BuildInfo:
    with open(path) as handle:
        content = json.load(handle)
    return BuildInfo(content["tensorflow"], tuple(content["build_info"]["cuda_compute_capabilities"]))


_ARCH = re.compile(r"(sm|compute)_(\d+)(\d)([af]?)")


def kernel_support(capability: tuple[int, int], architectures) -> tuple[str, str | None]:
    """(NATIVE, arch) when the wheel has machine code this GPU runs: sm_XY runs on compute
    capability X.Y and on later minors of major X (sm_XYa and sm_XYf only on X.Y itself);
    (JIT, arch) when it has only PTX for a capability at or below the GPU's, which the driver
    compiles for it at start; (UNSUPPORTED, None) otherwise."""
    machine_code, ptx = [], []
    for arch in architectures:
        match = _ARCH.fullmatch(arch)
        if not match:
            continue
        kind, major, minor, variant = match.group(1), int(match.group(2)), int(match.group(3)), match.group(4)
        if kind == "sm" and major == capability[0] and (minor == capability[1] or (minor < capability[1] and not variant)):
            machine_code.append(((major, minor), arch))
        elif kind == "compute" and (major, minor) <= capability and not variant:
            ptx.append(((major, minor), arch))
    if machine_code:
        return NATIVE, max(machine_code)[1]
    if ptx:
        return JIT, max(ptx)[1]
    return UNSUPPORTED, None


def _cc(gpu: Gpu) -> str:
    return f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}"


def gpu_warnings(accelerator_type: str, machine_type: str, accelerator_count: int) -> list[str]:
    """One line per thing a user of this GPU should know before paying for it."""
    gpu = GPUS[accelerator_type]
    lines = []
    support, arch = kernel_support(gpu.compute_capability, build_info().architectures)
    if support == JIT:
        lines.append(
            f"warning: {accelerator_type} (compute capability {_cc(gpu)}): TensorFlow {build_info().version}'s wheel "
            f"ships no kernels for this GPU, only {arch} PTX (it has {', '.join(build_info().architectures)}), so each "
            f"new container JIT-compiles them at start (30 minutes or longer, tensorflow/tensorflow#60739); the "
            f"image keeps them for later processes (CUDA_CACHE_MAXSIZE). Prove the image on this GPU first: "
            f"submit_job.py vertex --self-check --machine-type {machine_type} --accelerator-type {accelerator_type} "
            f"--accelerator-count {accelerator_count} ... (python -m trainer.selfcheck elsewhere)")
    if gpu.deprecated:
        lines.append(f"warning: {accelerator_type} is deprecated: {gpu.deprecated}; plan a move to another GPU")
    return lines
