"""The CUDA stack TensorFlow will load in this environment, asked from the libraries themselves.

No GPU is needed. TensorFlow 2.21 opens each CUDA library by its soname the first time a GPU is
used. The dynamic loader then searches LD_LIBRARY_PATH, the RUNPATH of the library that asks
(libtensorflow_framework.so.2 lists site-packages/nvidia/*/lib there), then the system's
libraries. `locate` searches in that order, so the file it finds is the file TensorFlow will
load; `probe` loads each with ctypes and asks its version. `problems` compares the result with
what TensorFlow 2.21 is known to train on, and `python -m trainer.gpu_stack` prints the stack and
exits 1 with one line when it is wrong. The GPU image runs it at build time and in its structure
tests, so an image with the wrong cuDNN cannot be built.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import os
import re
import shlex
import struct
import subprocess
import sys
from typing import Mapping

# cuDNN: TF 2.21 is built against 9.3 and refuses an older minor at start-up; with 9.3-9.5 its
# Conv2D autotuning fails on T4/A10G/L4 ("Autotuner could not find any supported configs"). 9.24.0
# is the oldest shown to train it (aws/deep-learning-containers#6418).
MIN_CUDNN = (9, 24, 0)
# The floors of TF 2.21's `and-cuda` extra; NCCL too (2.27.7).
MIN_CUDA = (12, 5, 0)
MIN_NCCL = (2, 27, 7)


@dataclasses.dataclass(frozen=True)
class Library:
    key: str
    soname: str
    wheel_dir: str  # site-packages/nvidia/<this>/lib in NVIDIA's wheel
    asker: str  # whose RUNPATH the loader searches: a TensorFlow binary, or another library's key
    minimum: tuple[int, ...] = ()


TF_FRAMEWORK = "tensorflow/libtensorflow_framework.so.2"
TF_CC = "tensorflow/libtensorflow_cc.so.2"
# Every CUDA library TF 2.21 opens (its binaries carry a loader stub for each), plus the two that
# those open in turn. TF 2.21 opens no cuRAND.
LIBRARIES = (
    Library("cudart", "libcudart.so.12", "cuda_runtime", TF_FRAMEWORK, MIN_CUDA),
    Library("cublas", "libcublas.so.12", "cublas", TF_FRAMEWORK, MIN_CUDA),
    Library("cublasLt", "libcublasLt.so.12", "cublas", TF_FRAMEWORK, MIN_CUDA),
    Library("cudnn", "libcudnn.so.9", "cudnn", TF_FRAMEWORK, MIN_CUDNN),
    Library("cufft", "libcufft.so.11", "cufft", TF_FRAMEWORK, (11, 2, 3)),
    Library("cusparse", "libcusparse.so.12", "cusparse", TF_FRAMEWORK, (12, 5, 1)),
    Library("cusolver", "libcusolver.so.11", "cusolver", TF_CC, (11, 6, 3)),
    Library("cupti", "libcupti.so.12", "cuda_cupti", TF_FRAMEWORK),
    Library("nccl", "libnccl.so.2", "nccl", TF_FRAMEWORK, MIN_NCCL),
    Library("nvjitlink", "libnvJitLink.so.12", "nvjitlink", "cusparse", MIN_CUDA),
    Library("nvrtc", "libnvrtc.so.12", "cuda_nvrtc", "cudnn_graph", MIN_CUDA),
)
# cuDNN's graph library (which opens NVRTC) sits beside libcudnn.so.9.
_ASKER_FILES = {"cudnn_graph": ("cudnn", "libcudnn_graph.so.9")}


@dataclasses.dataclass(frozen=True)
class Found:
    key: str
    path: str | None  # None: not found anywhere the loader looks
    version: tuple[int, ...] | None = None
    error: str | None = None

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version)) if self.version else "?"


@dataclasses.dataclass(frozen=True)
class Tool:
    name: str
    path: str | None
    version: tuple[int, ...] | None = None
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class Stack:
    tensorflow: str
    build: Mapping  # tf.sysconfig.get_build_info()
    libraries: tuple[Found, ...]
    cuda_data_dir: str  # where XLA looks for ptxas and libdevice
    cuda_data_dir_source: str
    ptxas: Tool
    libdevice: str | None
    nccl_net_plugin: str | None = None  # what NCCL loads as its network plugin; None: its own transport

    def library(self, key: str) -> Found:
        return next(f for f in self.libraries if f.key == key)


# --- where the loader looks -------------------------------------------------------------------

def elf_runpath(path: str) -> list[str]:
    """DT_RUNPATH (or DT_RPATH) of a 64-bit little-endian ELF file, $ORIGIN expanded; [] if none."""
    try:
        with open(path, "rb") as elf:
            header = elf.read(64)
            if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
                return []
            phoff, = struct.unpack_from("<Q", header, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
            elf.seek(phoff)
            table = elf.read(phentsize * phnum)
            loads, dynamic = [], None
            for i in range(phnum):
                p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
                if p_type == 1:
                    loads.append((p_vaddr, p_offset, p_filesz))
                elif p_type == 2:
                    dynamic = (p_offset, p_filesz)
            if dynamic is None:
                return []
            elf.seek(dynamic[0])
            entries = elf.read(dynamic[1])
            tags = {}
            for i in range(0, len(entries) - 15, 16):
                tag, value = struct.unpack_from("<qQ", entries, i)
                if tag == 0:
                    break
                tags.setdefault(tag, value)
            name_offset = tags.get(29, tags.get(15))  # DT_RUNPATH, else DT_RPATH
            if name_offset is None or 5 not in tags:  # DT_STRTAB
                return []
            strtab = next((off + tags[5] - vaddr for vaddr, off, size in loads if vaddr <= tags[5] < vaddr + size), None)
            if strtab is None:
                return []
            elf.seek(strtab + name_offset)
            text = elf.read(65536).split(b"\0", 1)[0].decode()
    except OSError:
        return []
    origin = os.path.dirname(os.path.abspath(path))
    return [os.path.normpath(p.replace("$ORIGIN", origin).replace("${ORIGIN}", origin)) for p in text.split(":") if p]


def _unique(paths) -> list[str]:
    return list(dict.fromkeys(p for p in paths if p))


def locate(soname: str, ld_library_path: str, runpath: list[str]) -> str | None:
    """The file the dynamic loader opens for `soname`: LD_LIBRARY_PATH first, then the asker's
    RUNPATH, then the system's cache and default directories."""
    for directory in _unique(ld_library_path.split(":") + runpath):
        candidate = os.path.join(directory, soname)
        if os.path.isfile(candidate):
            return os.path.realpath(candidate)
    try:
        output = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        output = ""
    for line in output.splitlines():
        name, _, target = line.strip().partition(" => ")
        if name.split(" ")[0] == soname and os.path.isfile(target):
            return os.path.realpath(target)
    for directory in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"):
        candidate = os.path.join(directory, soname)
        if os.path.isfile(candidate):
            return os.path.realpath(candidate)
    return None


# --- what each library says it is -------------------------------------------------------------

def _split_version(code: int, major_scale: int = 1000, minor_scale: int = 10) -> tuple[int, int]:
    """CUDA runtime style: 12090 -> (12, 9)."""
    return code // major_scale, (code % major_scale) // minor_scale


def decode_cudnn(code: int) -> tuple[int, int, int]:
    """cudnnGetVersion(): 9.x reports major*10000 + minor*100 + patch (92400 -> 9.24.0); 8.x
    reported major*1000 + minor*100 + patch (8907 -> 8.9.7)."""
    if code >= 90000:
        return code // 10000, (code % 10000) // 100, code % 100
    return code // 1000, (code % 1000) // 100, code % 100


def decode_nccl(code: int) -> tuple[int, int, int]:
    """ncclGetVersion(): major*10000 + minor*100 + patch since 2.9 (23007 -> 2.30.7), before that
    major*1000 + minor*100 + patch."""
    if code >= 10000:
        return code // 10000, (code % 10000) // 100, code % 100
    return code // 1000, (code % 1000) // 100, code % 100


def _ask_version(key: str, library: ctypes.CDLL) -> tuple[int, ...]:
    value = ctypes.c_int()

    def checked(status: int, what: str) -> None:
        if status != 0:
            raise OSError(f"{what} returned status {status}")

    if key == "cudart":
        checked(library.cudaRuntimeGetVersion(ctypes.byref(value)), "cudaRuntimeGetVersion")
        return _split_version(value.value)
    if key == "cudnn":
        library.cudnnGetVersion.restype = ctypes.c_size_t
        return decode_cudnn(library.cudnnGetVersion())
    if key == "nccl":
        checked(library.ncclGetVersion(ctypes.byref(value)), "ncclGetVersion")
        return decode_nccl(value.value)
    if key in ("nvjitlink", "nvrtc"):
        major, minor = (ctypes.c_int(), ctypes.c_int())
        function = library.nvJitLinkVersion if key == "nvjitlink" else library.nvrtcVersion
        checked(function(ctypes.byref(major), ctypes.byref(minor)), function.__name__)
        return major.value, minor.value
    if key == "cupti":
        api = ctypes.c_uint32()
        checked(library.cuptiGetVersion(ctypes.byref(api)), "cuptiGetVersion")
        return (api.value,)  # CUPTI's API version, not a CUDA release
    function = getattr(library, {"cublas": "cublasGetProperty", "cublasLt": "cublasLtGetProperty",
                                 "cufft": "cufftGetProperty", "cusparse": "cusparseGetProperty",
                                 "cusolver": "cusolverGetProperty"}[key])
    parts = []
    for property_type in range(3):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
        checked(function(property_type, ctypes.byref(value)), function.__name__)
        parts.append(value.value)
    return tuple(parts)


def load(key: str, path: str | None) -> Found:
    if path is None:
        return Found(key, None, error="not found")
    try:
        return Found(key, path, _ask_version(key, ctypes.CDLL(path)))
    except (OSError, AttributeError) as error:
        return Found(key, path, error=str(error).splitlines()[0])


# --- NCCL's network plugin ---------------------------------------------------------------------

NCCL_SONAME = "libnccl.so.2"
NCCL_NET_PLUGIN = "NCCL_NET_PLUGIN"


def nccl_net_plugin_names(environ: Mapping[str, str]) -> list[str]:
    """The libraries NCCL tries, in order, for its network plugin (NCCL's environment variables,
    NCCL_NET_PLUGIN): that variable's library (a path or a file name), then
    libnccl-net-<value>.so; without the variable, libnccl-net.so. `none` turns plugins off."""
    value = environ.get(NCCL_NET_PLUGIN, "").strip()
    if value.lower() == "none":
        return []
    if not value:
        return ["libnccl-net.so"]
    if "/" in value:
        return [value]
    return [value, f"libnccl-net-{value}.so"]


def nccl_net_plugin(environ: Mapping[str, str], nccl_path: str | None) -> str | None:
    """The network plugin file NCCL (at `nccl_path`) would load, found as the dynamic loader
    finds what NCCL dlopens; None when there is none and NCCL uses its own socket transport. Google's
    Reduction Server works through such a plugin (the apt package google-reduction-server)."""
    runpath = elf_runpath(nccl_path) if nccl_path else []
    for name in nccl_net_plugin_names(environ):
        if "/" in name:
            if os.path.isfile(name):
                return os.path.realpath(name)
            continue
        found = locate(name, environ.get("LD_LIBRARY_PATH", ""), runpath)
        if found:
            return found
    return None


def installed_nccl(environ: Mapping[str, str] = os.environ) -> str | None:
    """The libnccl.so.2 TensorFlow would load, found without importing TensorFlow."""
    import importlib.util

    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.origin:
        return None
    site_packages = os.path.dirname(os.path.dirname(spec.origin))
    return locate(NCCL_SONAME, environ.get("LD_LIBRARY_PATH", ""), elf_runpath(os.path.join(site_packages, TF_FRAMEWORK)))


# --- XLA's compiler tools ---------------------------------------------------------------------

def xla_cuda_data_dir(environ: Mapping[str, str], site_packages: str) -> tuple[str, str]:
    """Where XLA looks first for bin/ptxas and nvvm/libdevice: --xla_gpu_cuda_data_dir in
    XLA_FLAGS, else the nvcc wheel's folder, which TF 2.21 searches beside its own binaries."""
    for flag in shlex.split(environ.get("XLA_FLAGS", "")):
        if flag.startswith("--xla_gpu_cuda_data_dir="):
            return flag.split("=", 1)[1], "XLA_FLAGS"
    return os.path.join(site_packages, "nvidia", "cuda_nvcc"), "the nvcc wheel"


def ptxas(data_dir: str, environ: Mapping[str, str]) -> Tool:
    candidates = [os.path.join(data_dir, "bin", "ptxas")]
    candidates += [os.path.join(d, "ptxas") for d in environ.get("PATH", "").split(":") if d]
    path = next((c for c in candidates if os.path.isfile(c) and os.access(c, os.X_OK)), None)
    if path is None:
        return Tool("ptxas", None, error="not found")
    try:
        result = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as error:
        return Tool("ptxas", path, error=str(error))
    match = re.search(r"V(\d+)\.(\d+)\.(\d+)", result.stdout)
    if result.returncode != 0 or not match:
        return Tool("ptxas", path, error=f"--version exited {result.returncode}: {result.stderr.strip()[:200]}")
    return Tool("ptxas", path, tuple(int(g) for g in match.groups()))


# --- the whole stack --------------------------------------------------------------------------

def probe(environ: Mapping[str, str] = os.environ) -> Stack:
    import tensorflow as tf

    tf_dir = os.path.dirname(tf.__file__)
    site_packages = os.path.dirname(tf_dir)
    ld_library_path = environ.get("LD_LIBRARY_PATH", "")
    runpaths = {TF_FRAMEWORK: elf_runpath(os.path.join(site_packages, TF_FRAMEWORK)),
                TF_CC: elf_runpath(os.path.join(site_packages, TF_CC))}
    found: dict[str, Found] = {}
    for library in LIBRARIES:
        if library.asker in runpaths:
            runpath = runpaths[library.asker]
        else:
            sibling_of, file_name = _ASKER_FILES.get(library.asker, (library.asker, None))
            asker_path = found[sibling_of].path if sibling_of in found else None
            if asker_path and file_name:
                asker_path = os.path.join(os.path.dirname(asker_path), file_name)
            runpath = elf_runpath(asker_path) if asker_path else []
        found[library.key] = load(library.key, locate(library.soname, ld_library_path, runpath))
    data_dir, source = xla_cuda_data_dir(environ, site_packages)
    libdevice = os.path.join(data_dir, "nvvm", "libdevice", "libdevice.10.bc")
    return Stack(
        tensorflow=tf.__version__,
        build=dict(tf.sysconfig.get_build_info()),
        libraries=tuple(found[library.key] for library in LIBRARIES),
        cuda_data_dir=data_dir,
        cuda_data_dir_source=source,
        ptxas=ptxas(data_dir, environ),
        libdevice=libdevice if os.path.isfile(libdevice) else None,
        nccl_net_plugin=nccl_net_plugin(environ, found["nccl"].path),
    )


def _text(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def problems(stack: Stack) -> list[str]:
    """What stops this stack from training on a GPU, each as a short clause; [] when none."""
    if not stack.build.get("is_cuda_build"):
        return [f"TensorFlow {stack.tensorflow} is not a CUDA build (tensorflow-cpu?)"]
    found_problems = []
    for library in LIBRARIES:
        found = stack.library(library.key)
        if found.version is None:
            where = f" at {found.path}" if found.path else ""
            found_problems.append(f"{library.soname}{where}: {found.error}")
        elif library.minimum and found.version < library.minimum:
            why = (" (TF 2.21 refuses cuDNN below 9.3; 9.3-9.5 fail its Conv2D autotuning)"
                   if library.key == "cudnn" else "")
            found_problems.append(f"{library.key} {found.version_text} at {found.path} is older than "
                                  f"{_text(library.minimum)}{why}")
    if stack.ptxas.version is None:
        found_problems.append(f"ptxas (XLA's PTX assembler) {stack.ptxas.error} in {stack.cuda_data_dir}/bin or PATH")
    elif stack.ptxas.version < MIN_CUDA:
        found_problems.append(f"ptxas {_text(stack.ptxas.version)} at {stack.ptxas.path} is older than {_text(MIN_CUDA)}")
    if stack.libdevice is None:
        found_problems.append(f"libdevice.10.bc not in {stack.cuda_data_dir}/nvvm/libdevice, where XLA looks "
                              f"({stack.cuda_data_dir_source}); set XLA_FLAGS=--xla_gpu_cuda_data_dir=DIR")
    return found_problems


def describe(stack: Stack) -> list[str]:
    build = stack.build
    lines = [f"tensorflow {stack.tensorflow}: "
             + (f"CUDA build for CUDA {build.get('cuda_version')}, cuDNN {build.get('cudnn_version')}, "
                f"kernels for {','.join(build.get('cuda_compute_capabilities', []))}"
                if build.get("is_cuda_build") else "CPU build")]
    if not build.get("is_cuda_build"):
        return lines
    for found in stack.libraries:
        version = found.version_text if found.version else f"FAILED ({found.error})"
        if found.key == "cupti" and found.version:
            version = f"API {found.version[0]}"
        lines.append(f"  {found.key:10s} {version:12s} {found.path or '-'}")
    ptxas_version = _text(stack.ptxas.version) if stack.ptxas.version else f"FAILED ({stack.ptxas.error})"
    lines.append(f"  {'ptxas':10s} {ptxas_version:12s} {stack.ptxas.path or '-'}")
    lines.append(f"  {'libdevice':10s} {'found' if stack.libdevice else 'MISSING':12s} "
                 f"{stack.libdevice or stack.cuda_data_dir} (XLA's CUDA dir from {stack.cuda_data_dir_source})")
    plugin = stack.nccl_net_plugin or "(NCCL uses its own transport; Reduction Server needs Google's plugin)"
    lines.append(f"  {'nccl-net':10s} {'found' if stack.nccl_net_plugin else 'none':12s} {plugin}")
    return lines


def main() -> int:
    stack = probe()
    for line in describe(stack):
        print(line)
    found_problems = problems(stack)
    if found_problems:
        print(f"trainer.gpu_stack: error: {'; '.join(found_problems)}", file=sys.stderr)
        return 1
    print(f"gpu stack ok: cuDNN {stack.library('cudnn').version_text}, NCCL {stack.library('nccl').version_text}, "
          f"CUDA runtime {stack.library('cudart').version_text}, ptxas {_text(stack.ptxas.version)}")
    return 0
