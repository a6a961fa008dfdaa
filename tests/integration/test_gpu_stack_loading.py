"""trainer.gpu_stack against real shared libraries, built here with the C compiler: the RUNPATH it
reads, the order it searches, and the versions it asks for through ctypes."""

import shutil
import subprocess

import pytest

from trainer.checks import gpu_stack

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build test libraries")


def build_library(path, source: str, *link_flags: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    c_file = path.parent / "source.c"
    c_file.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(path), str(c_file), *link_flags], check=True)
    return path


def fake_cudnn(path, code: int):
    return build_library(path, f"#include <stddef.h>\nsize_t cudnnGetVersion(void) {{ return {code}; }}\n")


def test_runpath_is_read_and_origin_expanded(tmp_path):
    library = build_library(tmp_path / "tf" / "libasker.so", "int f(void) { return 1; }\n",
                            "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../nvidia/cudnn/lib:/opt/other")
    assert gpu_stack.elf_runpath(str(library)) == [str(tmp_path / "nvidia" / "cudnn" / "lib"), "/opt/other"]


def test_a_file_that_is_not_elf_has_no_runpath(tmp_path):
    (tmp_path / "text.so").write_text("not a library")
    assert gpu_stack.elf_runpath(str(tmp_path / "text.so")) == []


def test_ld_library_path_wins_over_the_runpath_as_in_the_dynamic_loader(tmp_path):
    wheel = fake_cudnn(tmp_path / "wheel" / "libcudnn.so.9", 92400)
    shadow = fake_cudnn(tmp_path / "shadow" / "libcudnn.so.9", 90100)
    assert gpu_stack.locate("libcudnn.so.9", "", [str(wheel.parent)]) == str(wheel)
    assert gpu_stack.locate("libcudnn.so.9", f"/nonexistent:{shadow.parent}", [str(wheel.parent)]) == str(shadow)


def test_the_version_is_asked_from_the_library_itself(tmp_path):
    assert gpu_stack.load("cudnn", str(fake_cudnn(tmp_path / "a" / "libcudnn.so.9", 90100))).version == (9, 1, 0)
    nccl = build_library(tmp_path / "b" / "libnccl.so.2", "int ncclGetVersion(int *v) { *v = 23007; return 0; }\n")
    assert gpu_stack.load("nccl", str(nccl)).version == (2, 30, 7)


def test_a_library_without_the_function_is_an_error_not_a_version(tmp_path):
    empty = build_library(tmp_path / "libcudnn.so.9", "int unrelated(void) { return 0; }\n")
    found = gpu_stack.load("cudnn", str(empty))
    assert found.version is None and "cudnnGetVersion" in found.error


def test_the_nccl_network_plugin_is_found_through_nccls_own_runpath(tmp_path):
    """NCCL dlopens its plugin: LD_LIBRARY_PATH, then libnccl's RUNPATH, then the system, as for any library."""
    nccl = build_library(tmp_path / "nvidia" / "nccl" / "lib" / "libnccl.so.2", "int ncclGetVersion(int *v) { *v = 23007; return 0; }\n",
                         "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../plugins")
    plugin = build_library(tmp_path / "nvidia" / "nccl" / "plugins" / "libnccl-net.so", "int ncclNetPlugin_v8;\n")
    assert gpu_stack.nccl_net_plugin({}, str(nccl)) == str(plugin)
    named = build_library(tmp_path / "gib" / "libnccl-net-gib.so", "int ncclNetPlugin_v8;\n")
    assert gpu_stack.nccl_net_plugin({"NCCL_NET_PLUGIN": "gib", "LD_LIBRARY_PATH": str(named.parent)}, str(nccl)) == str(named)
    assert gpu_stack.nccl_net_plugin({"NCCL_NET_PLUGIN": "none"}, str(nccl)) is None
