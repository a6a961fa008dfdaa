"""scripts/jobspec/accelerators.py: every row of the machine table against Vertex AI's page, each GPU's
compute capability, what the wheel's kernel list means for each GPU, and the wheel build info
file against the lock it was made from."""

from __future__ import annotations

import json
import re
import zipfile

import pytest

from helpers import REPO
from scripts.jobspec import accelerators
from scripts.jobspec.accelerators import JIT, NATIVE, UNSUPPORTED, AcceleratorError
from scripts.supply_chain import tensorflow_build_info

# Vertex AI "Configure compute resources for serverless training", "Valid numbers of GPUs for each
# machine type" (read 2026-11), typed here from the page as it reads, so an edit to the table that
# the page does not show fails.
P4, P100, T4, V100 = "NVIDIA_TESLA_P4", "NVIDIA_TESLA_P100", "NVIDIA_TESLA_T4", "NVIDIA_TESLA_V100"
PAGE = {
    "a3-megagpu-8g": {"NVIDIA_H100_MEGA_80GB": "8"},
    "a3-highgpu-1g": {"NVIDIA_H100_80GB": "1"}, "a3-highgpu-2g": {"NVIDIA_H100_80GB": "2"},
    "a3-highgpu-4g": {"NVIDIA_H100_80GB": "4"}, "a3-highgpu-8g": {"NVIDIA_H100_80GB": "8"},
    "a3-ultragpu-8g": {"NVIDIA_H200_141GB": "8"}, "a4-highgpu-8g": {"NVIDIA_B200": "8"},
    "a4x-highgpu-4g": {"NVIDIA_GB200": "4"},
    "a2-ultragpu-1g": {"NVIDIA_A100_80GB": "1"}, "a2-ultragpu-2g": {"NVIDIA_A100_80GB": "2"},
    "a2-ultragpu-4g": {"NVIDIA_A100_80GB": "4"}, "a2-ultragpu-8g": {"NVIDIA_A100_80GB": "8"},
    "a2-highgpu-1g": {"NVIDIA_TESLA_A100": "1"}, "a2-highgpu-2g": {"NVIDIA_TESLA_A100": "2"},
    "a2-highgpu-4g": {"NVIDIA_TESLA_A100": "4"}, "a2-highgpu-8g": {"NVIDIA_TESLA_A100": "8"},
    "a2-megagpu-16g": {"NVIDIA_TESLA_A100": "16"},
    "n1-standard-4": {P4: "1, 2, 4", P100: "1, 2, 4", T4: "1, 2, 4", V100: "1, 2, 4, 8"},
    "n1-standard-8": {P4: "1, 2, 4", P100: "1, 2, 4", T4: "1, 2, 4", V100: "1, 2, 4, 8"},
    "n1-standard-16": {P4: "1, 2, 4", P100: "1, 2, 4", T4: "1, 2, 4", V100: "2, 4, 8"},
    "n1-standard-32": {P4: "2, 4", P100: "2, 4", T4: "2, 4", V100: "4, 8"},
    "n1-standard-64": {P4: "4", T4: "4", V100: "8"},
    "n1-standard-96": {P4: "4", T4: "4", V100: "8"},
    "n1-highmem-2": {P4: "1, 2, 4", P100: "1, 2, 4", T4: "1, 2, 4", V100: "1, 2, 4, 8"},
    "n1-highmem-4": {P4: "1, 2, 4", P100: "1, 2, 4", T4: "1, 2, 4", V100: "1, 2, 4, 8"},
    "n1-highmem-8": {P4: "1, 2, 4", P100: "1, 2, 4", T4: "1, 2, 4", V100: "1, 2, 4, 8"},
    "n1-highmem-16": {P4: "1, 2, 4", P100: "1, 2, 4", T4: "1, 2, 4", V100: "2, 4, 8"},
    "n1-highmem-32": {P4: "2, 4", P100: "2, 4", T4: "2, 4", V100: "4, 8"},
    "n1-highmem-64": {P4: "4", T4: "4", V100: "8"},
    "n1-highmem-96": {P4: "4", T4: "4", V100: "8"},
    "n1-highcpu-16": {P4: "1, 2, 4", P100: "1, 2, 4", T4: "1, 2, 4", V100: "2, 4, 8"},
    "n1-highcpu-32": {P4: "2, 4", P100: "2, 4", T4: "2, 4", V100: "4, 8"},
    "n1-highcpu-64": {P4: "4", P100: "4", T4: "4", V100: "8"},
    "n1-highcpu-96": {P4: "4", T4: "4", V100: "8"},
    "g2-standard-4": {"NVIDIA_L4": "1"}, "g2-standard-8": {"NVIDIA_L4": "1"}, "g2-standard-12": {"NVIDIA_L4": "1"},
    "g2-standard-16": {"NVIDIA_L4": "1"}, "g2-standard-24": {"NVIDIA_L4": "2"}, "g2-standard-32": {"NVIDIA_L4": "1"},
    "g2-standard-48": {"NVIDIA_L4": "4"}, "g2-standard-96": {"NVIDIA_L4": "8"},
    "g4-standard-48": {"NVIDIA_RTX_PRO_6000": "1"}, "g4-standard-96": {"NVIDIA_RTX_PRO_6000": "2"},
    "g4-standard-192": {"NVIDIA_RTX_PRO_6000": "4"}, "g4-standard-384": {"NVIDIA_RTX_PRO_6000": "8"},
}
# NVIDIA, "CUDA GPUs - Compute Capability".
COMPUTE_CAPABILITY = {
    "NVIDIA_TESLA_K80": "3.7", P100: "6.0", P4: "6.1", V100: "7.0", T4: "7.5", "NVIDIA_TESLA_A100": "8.0",
    "NVIDIA_A100_80GB": "8.0", "NVIDIA_L4": "8.9", "NVIDIA_H100_80GB": "9.0", "NVIDIA_H100_MEGA_80GB": "9.0",
    "NVIDIA_H200_141GB": "9.0", "NVIDIA_B200": "10.0", "NVIDIA_GB200": "10.0", "NVIDIA_RTX_PRO_6000": "12.0",
}
WHEEL_2_21 = ("sm_60", "sm_70", "sm_80", "sm_89", "compute_90")


def counts(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in text.split(", "))


def test_the_gpu_rows_are_the_pages_table():
    gpu_rows = {name: machine.gpus for name, machine in accelerators.MACHINES.items() if machine.gpus}
    assert gpu_rows == {name: {gpu: counts(text) for gpu, text in row.items()} for name, row in PAGE.items()}


def test_every_machine_has_one_known_cpu_and_boot_disks_vertex_takes():
    for machine in accelerators.MACHINES.values():
        assert machine.cpu in (accelerators.X86_64, accelerators.ARM64), machine
        assert machine.boot_disks and set(machine.boot_disks) <= set(accelerators.BOOT_DISK_TYPES), machine
    assert [m.name for m in accelerators.MACHINES.values() if m.cpu != accelerators.X86_64] == ["a4x-highgpu-4g"]


def test_every_gpu_has_its_compute_capability():
    assert {name: "%d.%d" % gpu.compute_capability for name, gpu in accelerators.GPUS.items()} == COMPUTE_CAPABILITY


ROWS = [(name, gpu, n) for name, row in PAGE.items() for gpu, text in row.items() for n in counts(text)]


@pytest.mark.parametrize("machine, gpu, count", ROWS, ids=[f"{m}-{g}-{n}" for m, g, n in ROWS])
def test_each_row_of_the_table_is_taken_refused_as_retired_or_refused_as_not_x86(machine, gpu, count):
    if machine == "a4x-highgpu-4g":
        with pytest.raises(AcceleratorError, match=r"^machine type a4x-highgpu-4g has arm64 CPUs .*images are built "
                                                   r"for x86_64"):
            accelerators.check_machine(machine, gpu, count)
    elif gpu == P100:
        with pytest.raises(AcceleratorError, match=r"^NVIDIA_TESLA_P100 is retired: .*2026-09-15"):
            accelerators.check_machine(machine, gpu, count)
    else:
        assert accelerators.check_machine(machine, gpu, count).name == machine
        wrong = max(counts(PAGE[machine][gpu])) * 2
        with pytest.raises(AcceleratorError, match=rf"^machine type {machine} takes .* {gpu}, not {wrong}$"):
            accelerators.check_machine(machine, gpu, wrong)


@pytest.mark.parametrize("machine", sorted(m for m, spec in accelerators.MACHINES.items() if not spec.gpus))
def test_each_machine_without_gpus_takes_none(machine):
    assert accelerators.check_machine(machine, None, 0).name == machine
    with pytest.raises(AcceleratorError, match=rf"^machine type {machine} cannot take NVIDIA_L4 \(it takes no GPUs\)$"):
        accelerators.check_machine(machine, "NVIDIA_L4", 1)


@pytest.mark.parametrize("machine, message", [
    ("a3-ultragpu-8g", "machine type a3-ultragpu-8g comes with 8 NVIDIA_H200_141GB: give --accelerator-type "
                       "NVIDIA_H200_141GB --accelerator-count 8"),
    ("g2-standard-24", "machine type g2-standard-24 comes with 2 NVIDIA_L4"),
])
def test_a_machine_that_comes_with_gpus_needs_them_named(machine, message):
    with pytest.raises(AcceleratorError, match=f"^{re.escape(message)}"):
        accelerators.check_machine(machine, None, 0)


@pytest.mark.parametrize("machine, gpu, count, message", [
    ("n1-standard-8", "NVIDIA_TESLA_K80", 1, "NVIDIA_TESLA_K80 is retired: Compute Engine ended its support on 2024-05-01"),
    ("a3-ultragpu-8g", "NVIDIA_H100_80GB", 8, "machine type a3-ultragpu-8g cannot take NVIDIA_H100_80GB (it takes "
                                              "NVIDIA_H200_141GB)"),
    ("a4-highgpu-8g", "NVIDIA_B200", 4, "machine type a4-highgpu-8g takes 8 NVIDIA_B200, not 4"),
    ("n1-standard-32", T4, 1, "machine type n1-standard-32 takes 2 or 4 NVIDIA_TESLA_T4, not 1"),
    ("n1-standard-8", "NVIDIA_TESLA_V200", 1, "--accelerator-type NVIDIA_TESLA_V200 is not a GPU Vertex AI trains on"),
    ("n9-standard-8", None, 0, "machine type n9-standard-8 is not one Vertex AI offers for serverless training"),
])
def test_wrong_combinations_are_one_line(machine, gpu, count, message):
    with pytest.raises(AcceleratorError) as error:
        accelerators.check_machine(machine, gpu, count)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


@pytest.mark.parametrize("machine, disk, allowed", [
    ("a3-ultragpu-8g", "pd-ssd", False), ("a4-highgpu-8g", "pd-standard", False), ("g4-standard-48", "pd-ssd", False),
    ("a3-ultragpu-8g", "hyperdisk-balanced", True), ("a3-highgpu-8g", "hyperdisk-balanced", True),
    ("a3-megagpu-8g", "pd-ssd", True), ("n1-standard-8", "hyperdisk-balanced", False), ("n1-standard-8", "pd-standard", True),
    ("g2-standard-8", "hyperdisk-balanced", False), ("n4-standard-8", "pd-ssd", False), ("a2-highgpu-1g", "pd-ssd", True),
    ("n1-standard-8", "pd-balanced", False),
])
def test_boot_disk_types_each_machine_takes(machine, disk, allowed):
    if allowed:
        accelerators.check_boot_disk(machine, disk, None)
    else:
        with pytest.raises(AcceleratorError, match=rf"^--boot-disk-type {disk}: machine type {machine} boots only from "):
            accelerators.check_boot_disk(machine, disk, None)


def test_hyperdisk_only_machines_default_to_hyperdisk_balanced_and_others_to_pd_ssd():
    defaults = {name: machine.boot_disks[0] for name, machine in accelerators.MACHINES.items()}
    assert defaults["a3-ultragpu-8g"] == defaults["a4-highgpu-8g"] == "hyperdisk-balanced"  # Vertex's default there
    assert defaults["a3-highgpu-8g"] == defaults["n1-standard-8"] == defaults["a2-ultragpu-1g"] == "pd-ssd"


@pytest.mark.parametrize("size, ok", [(100, True), (64_000, True), (99, False), (64_001, False)])
def test_boot_disk_size_is_100_to_64000_gb(size, ok):
    if ok:
        accelerators.check_boot_disk("n1-standard-8", None, size)
    else:
        with pytest.raises(AcceleratorError, match="^--boot-disk-size-gb must be between 100 and 64000"):
            accelerators.check_boot_disk("n1-standard-8", None, size)


# --- the wheel's kernels --------------------------------------------------------------------------

@pytest.mark.parametrize("capability, architectures, expected", [
    ((7, 5), WHEEL_2_21, (NATIVE, "sm_70")),  # T4: sm_70 machine code runs on 7.5
    ((8, 6), WHEEL_2_21, (NATIVE, "sm_80")),  # A10G
    ((8, 9), WHEEL_2_21, (NATIVE, "sm_89")),  # L4
    ((6, 1), WHEEL_2_21, (NATIVE, "sm_60")),  # P4
    ((9, 0), WHEEL_2_21, (JIT, "compute_90")),  # H100, H200
    ((10, 0), WHEEL_2_21, (JIT, "compute_90")),  # B200: PTX is compiled forward
    ((12, 0), WHEEL_2_21, (JIT, "compute_90")),  # RTX PRO 6000
    ((3, 7), WHEEL_2_21, (UNSUPPORTED, None)),  # K80: nothing at or below 3.7
    ((7, 0), ("sm_80", "compute_80"), (UNSUPPORTED, None)),  # machine code of a later major does not run
    ((9, 0), ("sm_90a",), (NATIVE, "sm_90a")),  # arch-specific code runs on exactly 9.0
    ((10, 0), ("sm_90a",), (UNSUPPORTED, None)),
    ((8, 9), ("sm_86", "sm_80"), (NATIVE, "sm_86")),  # the newest that runs
])
def test_kernel_support_follows_cuda_binary_and_ptx_compatibility(capability, architectures, expected):
    assert accelerators.kernel_support(capability, architectures) == expected


def test_a_gpu_the_wheel_cannot_run_is_refused(monkeypatch):
    monkeypatch.setattr(accelerators, "build_info", lambda path=None: accelerators.BuildInfo("9.9", ("sm_80",)))
    with pytest.raises(AcceleratorError, match=r"^NVIDIA_TESLA_V100 \(compute capability 7.0\): the image's TensorFlow "
                                               r"9.9 has no kernels it can run there \(it has sm_80\)$"):
        accelerators.check_machine("n1-standard-8", V100, 1)


@pytest.mark.parametrize("gpu, machine, count", [("NVIDIA_H100_80GB", "a3-highgpu-8g", 8),
                                                 ("NVIDIA_H200_141GB", "a3-ultragpu-8g", 8),
                                                 ("NVIDIA_B200", "a4-highgpu-8g", 8)])
def test_a_gpu_with_only_ptx_gets_the_jit_warning_with_its_cost_and_the_self_check(gpu, machine, count):
    [warning] = accelerators.gpu_warnings(gpu, machine, count)
    assert warning.startswith(f"warning: {gpu} (compute capability {COMPUTE_CAPABILITY[gpu]}): TensorFlow 2.21.0's "
                              "wheel ships no kernels for this GPU, only compute_90 PTX")
    assert "30 minutes or longer" in warning and "--self-check" in warning
    assert f"--machine-type {machine} --accelerator-type {gpu} --accelerator-count {count}" in warning


def test_gpus_with_machine_code_get_no_jit_warning_and_deprecated_ones_say_so():
    assert accelerators.gpu_warnings("NVIDIA_TESLA_V100", "n1-standard-8", 1) == []
    assert accelerators.gpu_warnings("NVIDIA_L4", "g2-standard-8", 1) == []
    [t4] = accelerators.gpu_warnings(T4, "n1-standard-8", 1)
    assert t4.startswith("warning: NVIDIA_TESLA_T4 is deprecated: Compute Engine ends its support on 2027-08-01")


# --- the wheel's build info file --------------------------------------------------------------------

def test_the_build_info_file_is_the_locked_wheels():
    version, hashes = tensorflow_build_info.locked_tensorflow((REPO / "images/gpu/requirements.lock").read_text())
    content = json.loads((REPO / "images/gpu/tensorflow-build-info.json").read_text())
    assert content["tensorflow"] == version and content["sha256"] in hashes, \
        "images/gpu/requirements.lock changed tensorflow: run scripts/supply_chain/tensorflow_build_info.py"
    assert re.fullmatch(rf"tensorflow-{re.escape(version)}-cp311-cp311-manylinux_2_\d+_x86_64\.whl", content["wheel"])
    assert content["build_info"]["is_cuda_build"] is True
    assert accelerators.build_info().architectures == tuple(content["build_info"]["cuda_compute_capabilities"])


def fake_wheel(path, build_info_source: str):
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("tensorflow/python/platform/build_info.py", build_info_source)
        wheel.writestr("tensorflow/__init__.py", "")
    return path


def test_build_info_is_read_from_the_wheel_without_importing_it(tmp_path):
    source = ('import collections\nbuild_info = collections.OrderedDict([("cuda_compute_capabilities", '
              '["sm_80", "compute_90"]), ("cuda_version", "12.5.1"), ("is_cuda_build", True)])\n')
    wheel = fake_wheel(tmp_path / "tensorflow-9.9.9-cp311-cp311-manylinux_2_27_x86_64.whl", source)
    assert tensorflow_build_info.wheel_build_info(str(wheel)) == {
        "cuda_compute_capabilities": ["sm_80", "compute_90"], "cuda_version": "12.5.1", "is_cuda_build": True}
    digest = tensorflow_build_info.sha256_of(str(wheel))
    described = tensorflow_build_info.describe(str(wheel), "9.9.9", {digest})
    assert described["sha256"] == digest and described["wheel"] == wheel.name
    with pytest.raises(tensorflow_build_info.BuildInfoError, match="is not a wheel the lock allows"):
        tensorflow_build_info.describe(str(wheel), "9.9.9", {"0" * 64})


def test_a_cpu_wheel_is_refused(tmp_path):
    wheel = fake_wheel(tmp_path / "t.whl", "import collections\nbuild_info = collections.OrderedDict([('is_cuda_build', False)])\n")
    with pytest.raises(tensorflow_build_info.BuildInfoError, match="is not a CUDA build"):
        tensorflow_build_info.describe(str(wheel), "1", {tensorflow_build_info.sha256_of(str(wheel))})


def test_the_gpu_page_shows_the_table():
    """docs/gpus.md's table, row by row: the capability and, for the machines that come with their
    GPUs, every machine type and count; what it says of the wheel matches the kernel rules."""
    rows = [line.split("|")[1:-1] for line in (REPO / "docs" / "gpus.md").read_text().splitlines()
            if line.startswith("| `NVIDIA_")]
    shown = set()
    for gpu_cell, capability, machines, wheel in rows:
        gpu = accelerators.GPUS[gpu_cell.strip().strip("`")]
        shown.add(gpu.name)
        assert capability.strip() == "%d.%d" % gpu.compute_capability, gpu.name
        expected = {name: m.gpus[gpu.name][0] for name, m in accelerators.MACHINES.items()
                    if gpu.name in m.gpus and not name.startswith("n1-")}
        assert {name: int(n) for name, n in re.findall(r"`([a-z0-9-]+)` \((\d+)\)", machines)} == expected, gpu.name
        support, arch = accelerators.kernel_support(gpu.compute_capability, accelerators.build_info().architectures)
        assert wheel.strip() == ("PTX only: JIT at start" if support == JIT else f"{arch} kernels"), gpu.name
    assert shown == {name for name, gpu in accelerators.GPUS.items() if not gpu.retired and name != "NVIDIA_GB200"}
