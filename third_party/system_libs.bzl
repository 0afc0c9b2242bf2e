"""Repository rules that find weft's system libraries.

Each library is found under a default prefix (Debian's layout) or under the prefix named
by an environment variable (WEFT_TORCH_HOME, WEFT_MPI_HOME, ...), so a user can point the
build at a CUDA build of LibTorch or at another MPI. The headers are symlinked into the
external repository and declared, because Bazel rejects headers reached through an
absolute -I outside the workspace.

A missing required library fails the build with the Debian package that provides it; a
missing optional one (CUDA/NCCL, UCX) yields an empty library plus `FOUND = False` in the
repository's defs.bzl, and the backends that need it are left out with a message.
"""

_DEFAULT_LIBDIRS = ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"]

def _exists(rctx, path):
    return rctx.path(path).exists

def _first_existing(rctx, candidates):
    for c in candidates:
        if c and _exists(rctx, c):
            return c
    return None

def _shell_words(rctx, argv):
    """Runs argv and returns its stdout split into words, or [] if it failed."""
    if "/" in argv[0]:
        # An absolute tool (e.g. /usr/bin/python3: Debian's, not whichever comes first).
        tool = rctx.path(argv[0]) if _exists(rctx, argv[0]) else None
    else:
        tool = rctx.which(argv[0])
    if tool == None:
        return []
    result = rctx.execute([tool] + argv[1:])
    if result.return_code != 0:
        return []
    return [w for w in result.stdout.replace("\n", " ").split(" ") if w]

def _missing(rctx, message):
    if rctx.attr.required:
        fail("\n\nweft: {}\nInstall it with: apt-get install {}\nor set {} to its install prefix.\n".format(
            message,
            " ".join(rctx.attr.packages),
            rctx.attr.env,
        ))

    # buildifier: disable=print
    print("weft: {} -- the parts that need it are disabled (set {} to enable them).".format(
        message,
        rctx.attr.env,
    ))
    rctx.file("BUILD.bazel", """package(default_visibility = ["//visibility:public"])
cc_library(name = "lib")
""")
    rctx.file("defs.bzl", "FOUND = False\nPREFIX = \"\"\n")

def _system_library_impl(rctx):
    prefix = rctx.os.environ.get(rctx.attr.env, "").strip()
    include_roots = []
    lib_dirs = []
    if prefix:
        include_roots = [prefix + "/include"]
        lib_dirs = [prefix + "/lib", prefix + "/lib64"]
    else:
        if rctx.attr.include_query:
            include_roots = _shell_words(rctx, rctx.attr.include_query)
        if rctx.attr.lib_query:
            lib_dirs = _shell_words(rctx, rctx.attr.lib_query)
        include_roots = include_roots + rctx.attr.default_include_roots
        lib_dirs = lib_dirs + rctx.attr.default_lib_dirs + _DEFAULT_LIBDIRS

    # The include root is the first candidate that holds the probe header.
    include_root = _first_existing(rctx, [r + "/" + rctx.attr.probe_header for r in include_roots])
    if include_root == None:
        _missing(rctx, "{} not found (looked for {} under {})".format(
            rctx.attr.display_name,
            rctx.attr.probe_header,
            ", ".join(include_roots),
        ))
        return
    include_root = include_root[:-len(rctx.attr.probe_header) - 1]

    # The library directory is the first that holds the first library.
    lib_dir = None
    libs = list(rctx.attr.libs)
    if rctx.attr.lib_prefix_glob:
        lib_dir = _first_existing(rctx, lib_dirs)
        if lib_dir != None:
            libs = sorted([
                f.basename[3:-3]
                for f in rctx.path(lib_dir).readdir()
                if f.basename.startswith("lib" + rctx.attr.lib_prefix_glob) and f.basename.endswith(".so")
            ])
    elif libs:
        for d in lib_dirs:
            if _exists(rctx, d + "/lib" + libs[0] + ".so") or _exists(rctx, d + "/lib" + libs[0] + ".a"):
                lib_dir = d
                break
    if (libs or rctx.attr.lib_prefix_glob) and (lib_dir == None or not libs):
        _missing(rctx, "{} headers found in {} but not its libraries ({}) in {}".format(
            rctx.attr.display_name,
            include_root,
            ", ".join(libs or [rctx.attr.lib_prefix_glob + "*"]),
            ", ".join(lib_dirs),
        ))
        return

    header_dirs = rctx.attr.header_dirs
    if header_dirs == ["*"]:
        header_dirs = [f.basename for f in rctx.path(include_root).readdir()]
    for d in header_dirs:
        src = include_root + "/" + d
        if _exists(rctx, src):
            rctx.symlink(src, "include/" + d)

    linkopts = []
    if lib_dir:
        linkopts = ["-L" + lib_dir, "-Wl,-rpath," + lib_dir]
        if rctx.attr.as_needed:
            linkopts.append("-Wl,--as-needed")
        linkopts += ["-l" + l for l in libs]
        if rctx.attr.as_needed:
            linkopts.append("-Wl,--no-as-needed")
    linkopts += rctx.attr.extra_linkopts

    includes = ["include"] + ["include/" + i for i in rctx.attr.extra_includes]
    rctx.file("BUILD.bazel", """package(default_visibility = ["//visibility:public"])

cc_library(
    name = "lib",
    hdrs = glob(["include/**"], allow_empty = True),
    includes = {includes},
    defines = {defines},
    linkopts = {linkopts},
)
""".format(
        includes = repr(includes),
        defines = repr(rctx.attr.defines),
        linkopts = repr(linkopts),
    ))
    rctx.file("defs.bzl", "FOUND = True\nPREFIX = {}\n".format(repr(include_root)))

system_library = repository_rule(
    implementation = _system_library_impl,
    local = True,
    environ = [
        "WEFT_TORCH_HOME",
        "WEFT_MPI_HOME",
        "WEFT_ABSL_HOME",
        "WEFT_GTEST_HOME",
        "WEFT_DLPACK_HOME",
        "WEFT_UCX_HOME",
        "WEFT_CUDA_HOME",
        "WEFT_PYTHON_HOME",
        "PATH",
    ],
    attrs = {
        "display_name": attr.string(mandatory = True),
        "env": attr.string(mandatory = True, doc = "Environment variable naming an install prefix."),
        "packages": attr.string_list(doc = "Debian packages that provide the library."),
        "required": attr.bool(default = True),
        "probe_header": attr.string(mandatory = True),
        "header_dirs": attr.string_list(doc = "Entries under the include root to expose."),
        "extra_includes": attr.string_list(doc = "Further include paths, relative to the root."),
        "default_include_roots": attr.string_list(default = ["/usr/include"]),
        "default_lib_dirs": attr.string_list(),
        "include_query": attr.string_list(doc = "Command printing include directories."),
        "lib_query": attr.string_list(doc = "Command printing library directories."),
        "libs": attr.string_list(),
        "lib_prefix_glob": attr.string(doc = "Link every lib<this>*.so found (abseil)."),
        "as_needed": attr.bool(default = False),
        "extra_linkopts": attr.string_list(),
        "defines": attr.string_list(),
    },
)

def weft_system_libraries():
    """Declares every system library weft can use."""
    system_library(
        name = "torch",
        display_name = "LibTorch",
        env = "WEFT_TORCH_HOME",
        packages = ["libtorch-dev"],
        probe_header = "ATen/ATen.h",
        header_dirs = ["torch", "ATen", "c10", "caffe2"],
        extra_includes = ["torch/csrc/api/include"],
        libs = ["torch", "torch_cpu", "c10"],
    )
    system_library(
        name = "mpi",
        display_name = "MPI (Open MPI)",
        env = "WEFT_MPI_HOME",
        packages = ["libopenmpi-dev", "openmpi-bin"],
        probe_header = "mpi.h",
        header_dirs = ["mpi.h", "mpi_portable_platform.h", "mpi-ext.h", "openmpi", "mpif.h"],
        include_query = ["mpicc", "--showme:incdirs"],
        lib_query = ["mpicc", "--showme:libdirs"],
        default_include_roots = ["/usr/lib/x86_64-linux-gnu/openmpi/include"],
        default_lib_dirs = ["/usr/lib/x86_64-linux-gnu/openmpi/lib"],
        libs = ["mpi"],
        # weft uses the C API only; the deprecated C++ bindings need another library.
        defines = ["OMPI_SKIP_MPICXX=1", "MPICH_SKIP_MPICXX=1"],
    )
    system_library(
        name = "absl",
        display_name = "abseil",
        env = "WEFT_ABSL_HOME",
        packages = ["libabsl-dev"],
        probe_header = "absl/status/status.h",
        header_dirs = ["absl"],
        lib_prefix_glob = "absl_",
        # Not --as-needed: in Bazel's dynamic test linking the intermediate libraries carry
        # no dependencies of their own, so the test binary must keep every abseil library.
    )
    system_library(
        name = "gtest",
        display_name = "GoogleTest",
        env = "WEFT_GTEST_HOME",
        packages = ["libgtest-dev", "libgmock-dev"],
        probe_header = "gtest/gtest.h",
        header_dirs = ["gtest", "gmock"],
        libs = ["gmock", "gtest"],
        extra_linkopts = ["-pthread"],
    )
    system_library(
        name = "dlpack",
        display_name = "DLPack",
        env = "WEFT_DLPACK_HOME",
        packages = ["libdlpack-dev"],
        probe_header = "dlpack/dlpack.h",
        header_dirs = ["dlpack"],
    )
    system_library(
        name = "ucx",
        display_name = "UCX",
        env = "WEFT_UCX_HOME",
        packages = ["libucx-dev", "ucx-utils"],
        required = False,
        probe_header = "ucp/api/ucp.h",
        header_dirs = ["ucp", "ucs", "uct", "ucm"],
        libs = ["ucp", "uct", "ucs"],
        defines = ["WEFT_WITH_UCX=1"],
    )
    system_library(
        name = "cuda",
        display_name = "CUDA with NCCL",
        env = "WEFT_CUDA_HOME",
        packages = ["nvidia-cuda-toolkit", "libnccl-dev"],
        required = False,
        probe_header = "nccl.h",
        default_include_roots = ["/usr/local/cuda/include", "/usr/include"],
        default_lib_dirs = ["/usr/local/cuda/lib64", "/usr/local/cuda/lib"],
        header_dirs = ["*"],
        libs = ["cudart", "nccl"],
        defines = ["WEFT_WITH_NCCL=1"],
    )
    system_library(
        name = "python",
        display_name = "Python 3 headers",
        env = "WEFT_PYTHON_HOME",
        packages = ["python3-dev"],
        required = False,
        probe_header = "Python.h",
        include_query = ["/usr/bin/python3", "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
        header_dirs = ["*"],
    )
