"""Project macros: the common options in one place, and tests expanded over rank counts."""

# Every C++ target of weft carries its language level and warnings itself, so that a
# workspace depending on @weft builds it without weft's .bazelrc. The optimization level is
# the build's (-c opt, --copt): a target's own -O would override -c dbg and the sanitizers'.
WEFT_COPTS = [
    "-std=c++17",
    "-Wall",
    "-Wextra",
    "-Wno-sign-compare",
    "-Wno-unused-parameter",
    "-Wno-missing-field-initializers",
]

def weft_cc_library(name, copts = [], **kwargs):
    native.cc_library(name = name, copts = WEFT_COPTS + copts, **kwargs)

def weft_cc_binary(name, copts = [], **kwargs):
    native.cc_binary(name = name, copts = WEFT_COPTS + copts, **kwargs)

def weft_cc_test(name, copts = [], deps = [], **kwargs):
    """A single-process GoogleTest test."""
    native.cc_test(
        name = name,
        copts = WEFT_COPTS + copts,
        deps = deps + ["//tests:gtest_main"],
        **kwargs
    )

def weft_mpi_test(name, srcs, deps = [], ranks = [1, 2, 4], size = "medium", env = {}, args = [], tags = [], copts = [], **kwargs):
    """A GoogleTest binary run under real `mpirun`, once per rank count.

    Creates `<name>_bin` and one test `<name>_np<N>` per entry of `ranks`, plus a
    test_suite `<name>` over all of them.
    """
    native.cc_binary(
        name = name + "_bin",
        srcs = srcs,
        copts = WEFT_COPTS + copts,
        deps = deps + ["//tests:mpi_gtest_main"],
        testonly = True,
        **kwargs
    )
    weft_mpi_program_test(name, ":{}_bin".format(name), ranks = ranks, size = size, env = env, args = args, tags = tags)

def weft_mpi_program_test(name, binary, ranks = [1, 2, 4], size = "medium", env = {}, args = [], tags = [], data = []):
    """Runs an existing program (any language) under real `mpirun`, once per rank count:
    tests `<name>_np<N>` and a test_suite `<name>` over them."""
    tests = []
    for n in ranks:
        test_name = "{}_np{}".format(name, n)
        # Multi-rank tests oversubscribe the machine; running them one at a time keeps
        # them from starving each other's progress threads.
        wanted = ["mpi", "exclusive"] if n > 2 else ["mpi"]
        native.sh_test(
            name = test_name,
            srcs = ["//tests:mpirun_test.sh"],
            args = [str(n), "$(location {})".format(binary)] + args,
            data = [binary] + data,
            size = size,
            env = env,
            tags = tags + [t for t in wanted if t not in tags],
        )
        tests.append(":" + test_name)
    native.test_suite(name = name, tests = tests, tags = tags)
