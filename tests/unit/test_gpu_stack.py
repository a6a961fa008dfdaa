"""trainer.gpu_stack: version codes and the verdict on a stack, from plain values."""

import dataclasses

import pytest

from trainer.checks import gpu_stack
from trainer.checks.gpu_stack import Found, Stack, Tool

GOOD_VERSIONS = {"cudart": (12, 9), "cublas": (12, 9, 1), "cublasLt": (12, 9, 1), "cudnn": (9, 24, 0),
                 "cufft": (11, 4, 1), "cusparse": (12, 5, 10), "cusolver": (11, 7, 5), "cupti": (28,),
                 "nccl": (2, 30, 7), "nvjitlink": (12, 9), "nvrtc": (12, 9)}


def stack(**overrides) -> Stack:
    libraries = tuple(Found(key, f"/site/nvidia/{key}/lib/{key}.so", version) for key, version in GOOD_VERSIONS.items())
    good = Stack(tensorflow="2.21.0", build={"is_cuda_build": True, "cuda_version": "12.5.1", "cudnn_version": "9"},
                 libraries=libraries, cuda_data_dir="/site/nvidia/cuda_nvcc", cuda_data_dir_source="XLA_FLAGS",
                 ptxas=Tool("ptxas", "/site/nvidia/cuda_nvcc/bin/ptxas", (12, 9, 86)),
                 libdevice="/site/nvidia/cuda_nvcc/nvvm/libdevice/libdevice.10.bc")
    return dataclasses.replace(good, **overrides)


def replace_library(found: Found) -> tuple[Found, ...]:
    return tuple(found if f.key == found.key else f for f in stack().libraries)


@pytest.mark.parametrize("code, version", [(92400, (9, 24, 0)), (90300, (9, 3, 0)), (90100, (9, 1, 0)), (8907, (8, 9, 7))])
def test_cudnn_version_codes(code, version):
    assert gpu_stack.decode_cudnn(code) == version


@pytest.mark.parametrize("code, version", [(23007, (2, 30, 7)), (22703, (2, 27, 3)), (2708, (2, 7, 8))])
def test_nccl_version_codes(code, version):
    assert gpu_stack.decode_nccl(code) == version


def test_the_locked_stack_has_no_problems():
    assert gpu_stack.problems(stack()) == []


def test_a_cudnn_below_the_minimum_is_named_with_its_path():
    old = Found("cudnn", "/usr/lib/x86_64-linux-gnu/libcudnn.so.9", (9, 2, 1))
    [problem] = gpu_stack.problems(stack(libraries=replace_library(old)))
    assert problem.startswith("cudnn 9.2.1 at /usr/lib/x86_64-linux-gnu/libcudnn.so.9 is older than 9.24.0")


def test_a_missing_library_and_missing_xla_tools_are_each_named():
    missing = Found("nccl", None, error="not found")
    found = gpu_stack.problems(stack(libraries=replace_library(missing), ptxas=Tool("ptxas", None, error="not found"),
                                     libdevice=None))
    assert found[0] == "libnccl.so.2: not found"
    assert "ptxas" in found[1] and "libdevice.10.bc not in /site/nvidia/cuda_nvcc/nvvm/libdevice" in found[2]


def test_a_cpu_build_of_tensorflow_is_one_problem():
    assert gpu_stack.problems(stack(build={"is_cuda_build": False})) == ["TensorFlow 2.21.0 is not a CUDA build (tensorflow-cpu?)"]


def test_xla_data_dir_comes_from_xla_flags_else_the_nvcc_wheel():
    flags = {"XLA_FLAGS": "--xla_gpu_autotune_level=2 --xla_gpu_cuda_data_dir=/opt/cuda"}
    assert gpu_stack.xla_cuda_data_dir(flags, "/site") == ("/opt/cuda", "XLA_FLAGS")
    assert gpu_stack.xla_cuda_data_dir({}, "/site") == ("/site/nvidia/cuda_nvcc", "the nvcc wheel")


@pytest.mark.parametrize("environ, names", [
    ({}, ["libnccl-net.so"]),
    ({"NCCL_NET_PLUGIN": "gib"}, ["gib", "libnccl-net-gib.so"]),
    ({"NCCL_NET_PLUGIN": "libnccl-net-fastsocket.so"}, ["libnccl-net-fastsocket.so", "libnccl-net-libnccl-net-fastsocket.so.so"]),
    ({"NCCL_NET_PLUGIN": "/usr/local/gib/lib64/libnccl-net.so"}, ["/usr/local/gib/lib64/libnccl-net.so"]),
    ({"NCCL_NET_PLUGIN": "none"}, []),
])
def test_the_network_plugins_nccl_tries_in_order(environ, names):
    assert gpu_stack.nccl_net_plugin_names(environ) == names


def test_the_network_plugin_is_found_where_the_loader_looks_or_reported_missing(tmp_path):
    plugin = tmp_path / "plugins" / "libnccl-net.so"
    plugin.parent.mkdir()
    plugin.write_bytes(b"")
    assert gpu_stack.nccl_net_plugin({"LD_LIBRARY_PATH": str(plugin.parent)}, None) == str(plugin)
    assert gpu_stack.nccl_net_plugin({"LD_LIBRARY_PATH": str(plugin.parent), "NCCL_NET_PLUGIN": "none"}, None) is None
    assert gpu_stack.nccl_net_plugin({"NCCL_NET_PLUGIN": str(plugin)}, None) == str(plugin)
    assert gpu_stack.nccl_net_plugin({"NCCL_NET_PLUGIN": str(tmp_path / "missing.so")}, None) is None


def test_the_stack_description_says_whether_nccl_has_a_network_plugin():
    assert gpu_stack.describe(stack())[-1].split()[:2] == ["nccl-net", "none"]
    assert gpu_stack.describe(stack(nccl_net_plugin="/usr/lib/libnccl-net.so"))[-1].split() == [
        "nccl-net", "found", "/usr/lib/libnccl-net.so"]
    assert gpu_stack.problems(stack()) == []  # a plugin is for Reduction Server jobs, not required


def reducer_cluster(reducers):
    from trainer.cluster import Cluster

    return Cluster("worker", 0, False, None, 2, 0, False, {"cluster": {}, "task": {}}, "TF_CONFIG", num_reducers=reducers)


def test_mwms_all_reduces_over_nccl_only_when_reducers_and_gpus_are_there():
    import logging

    from trainer.runtime import strategy

    assert strategy.collective_implementation(reducer_cluster(0), 8, None)[0] == "AUTO"
    implementation, why, level = strategy.collective_implementation(reducer_cluster(4), 0, None)
    assert (implementation, level) == ("AUTO", logging.INFO) and "no GPU here" in why
    implementation, why, level = strategy.collective_implementation(reducer_cluster(4), 8, None)
    assert (implementation, level) == ("NCCL", logging.WARNING)
    assert "finds no network plugin (libnccl-net.so)" in why and "google-reduction-server" in why
    implementation, why, level = strategy.collective_implementation(reducer_cluster(4), 8, "/usr/lib/libnccl-net.so")
    assert (implementation, level) == ("NCCL", logging.INFO) and why.endswith("/usr/lib/libnccl-net.so")
