"""What a workspace that depends on weft declares, in its WORKSPACE:

    local_repository(name = "weft", path = "/path/to/weft")
    load("@weft//:deps.bzl", "weft_dependencies")
    weft_dependencies()
"""

load("//third_party:system_libs.bzl", "weft_system_libraries")

def _vendored_impl(rctx):
    # weft's checkout, wherever it is: the directory of this file's repository.
    root = rctx.path(Label("//:deps.bzl")).dirname
    source = root.get_child("third_party").get_child(rctx.attr.directory)
    for child in source.readdir():
        rctx.symlink(child, child.basename)

_vendored = repository_rule(
    implementation = _vendored_impl,
    attrs = {"directory": attr.string(mandatory = True)},
    local = True,
)

def weft_dependencies():
    """Declares what building weft needs, for a workspace without network access:

    - the system libraries (LibTorch, MPI, abseil, DLPack, GoogleTest; UCX and CUDA/NCCL
      when they are installed, left out otherwise), each found under Debian's prefix or
      the one its WEFT_*_HOME variable names;
    - rules_cc and remote_coverage_tools, which Bazel's C++ toolchain and test rules load,
      from the copies in weft's third_party/; and rules_java from Debian's
      bazel-rules-java, which Debian's Bazel loads for every build.

    rules_cc, remote_coverage_tools and rules_java declared before the call are kept; the
    system libraries (@torch, @mpi, @absl, @gtest, @dlpack, @ucx, @cuda) are weft's own, so
    point them elsewhere with the WEFT_*_HOME variables rather than declaring them."""
    existing = native.existing_rules()
    if "rules_cc" not in existing:
        _vendored(name = "rules_cc", directory = "rules_cc")
    if "remote_coverage_tools" not in existing:
        _vendored(name = "remote_coverage_tools", directory = "remote_coverage_tools")
    if "rules_java" not in existing:
        native.local_repository(name = "rules_java", path = "/usr/share/bazel/rules/java")
    weft_system_libraries()
