"""The NCCL backend's targets, defined only when the repository rule found CUDA and NCCL
(`@cuda//:defs.bzl`); without them the package is empty and weft builds without it."""

load("@cuda//:defs.bzl", "FOUND", "PREFIX")
load("//tools/bazel:weft.bzl", "weft_cc_library")

# Real GPUs the kernels are compiled for, plus PTX that newer GPUs compile at load time.
_CUDA_ARCHS = ["75", "80", "86", "90"]
_PTX_ARCH = "90"

def weft_nccl_backend():
    """//comm/nccl: the NCCL data plane and the device kernels it needs."""
    if not FOUND:
        return

    # PREFIX is the include root (e.g. /usr/local/cuda/include); nvcc sits beside it.
    nvcc = PREFIX.rsplit("/", 1)[0] + "/bin/nvcc"
    gencode = " ".join(["-gencode arch=compute_{a},code=sm_{a}".format(a = a) for a in _CUDA_ARCHS])
    gencode += " -gencode arch=compute_{a},code=compute_{a}".format(a = _PTX_ARCH)

    # nvcc through a genrule: Bazel 4's C++ rules know no CUDA. --fmad=false keeps the sums
    # bit-identical to the CPU kernels'; -fPIC lets the archive go into shared libraries.
    native.genrule(
        name = "kernels_lib",
        srcs = [
            "kernels.cu",
            "kernels.h",
            "//comm:rounded_division.h",
        ],
        # Bazel links .pic.a archives into PIC links (the default here) and .a into the
        # others; both are the same -fPIC archive.
        outs = [
            "libweft_nccl_kernels.a",
            "libweft_nccl_kernels.pic.a",
        ],
        cmd = " ".join([
            "NVCC={};".format(nvcc),
            "if [ ! -x \"$$NVCC\" ]; then NVCC=$$(command -v nvcc || true); fi;",
            "if [ -z \"$$NVCC\" ]; then",
            "echo 'weft: nvcc not found at {} nor on PATH; the NCCL backend needs it (set WEFT_CUDA_HOME to the CUDA toolkit)' >&2;".format(nvcc),
            "exit 1; fi;",
            # The include root is the repository's own, also when weft is an external
            # repository (external/weft/comm/nccl/kernels.h: -Iexternal/weft).
            "ROOT=$$(dirname $(location kernels.h))/../..;",
            "\"$$NVCC\" -std=c++17 -O3 --fmad=false -Xcompiler -fPIC -I$$ROOT",
            gencode,
            "-lib -o $(location libweft_nccl_kernels.a) $(location kernels.cu)",
            "&& cp $(location libweft_nccl_kernels.a) $(location libweft_nccl_kernels.pic.a)",
        ]),
        message = "Compiling the NCCL backend's CUDA kernels with nvcc",
    )

    # A library of its own, so the linker sees the archive after nccl_ops.o, which uses it.
    native.cc_library(
        name = "kernels",
        srcs = [":kernels_lib"],
        linkstatic = True,
        hdrs = ["kernels.h"],
        visibility = ["//tests/gpu:__pkg__"],  # kernels_test: against the CPU kernels
        deps = ["@cuda//:lib"],
    )

    weft_cc_library(
        name = "nccl",
        srcs = ["nccl_ops.cc"],
        hdrs = ["nccl_ops.h"],
        visibility = ["//comm:__pkg__"],
        deps = [
            ":kernels",
            "//core",
            "@cuda//:lib",
            "@mpi//:lib",
        ],
    )
