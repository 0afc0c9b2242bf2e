"""GPU tests, defined only when CUDA and NCCL were found (`@cuda//:defs.bzl`)."""

load("@cuda//:defs.bzl", "FOUND")
load("//tools/bazel:weft.bzl", "weft_cc_test", "weft_mpi_program_test", "weft_mpi_test")

# Every op that has a WEFT_<OP>_BY_MPI switch: the two-rank variant forces them all, since
# NCCL refuses two ranks on one GPU.
_ALL_BY_MPI = {
    "WEFT_ALLREDUCE_BY_MPI": "1",
    "WEFT_BROADCAST_BY_MPI": "1",
    "WEFT_ALLGATHER_BY_MPI": "1",
    "WEFT_NEIGHBOR_ALLGATHER_BY_MPI": "1",
    "WEFT_NEIGHBOR_ALLREDUCE_BY_MPI": "1",
    "WEFT_HIERARCHICAL_NEIGHBOR_ALLREDUCE_BY_MPI": "1",
    "WEFT_PAIR_GOSSIP_BY_MPI": "1",
    "WEFT_SEND_RECV_BY_MPI": "1",
}

def weft_gpu_tests():
    """kernels_test (the device kernels against the CPU's), nccl_test_np1 (NCCL, one rank)
    and nccl_staged_test_np2 (MPI staging, two ranks)."""
    if not FOUND:
        return
    weft_cc_test(
        name = "kernels_test",
        size = "small",
        srcs = [
            "cuda_device.h",
            "kernels_test.cc",
            "//tests:comm/test_util.h",
        ],
        tags = ["gpu"],
        deps = [
            "//comm",
            "//comm:reduce",
            "//comm/nccl:kernels",
            "//core",
            "@cuda//:lib",
        ],
    )

    weft_mpi_test(
        name = "nccl_test",
        srcs = [
            "cuda_device.h",
            "nccl_test.cc",
            "//tests:comm/test_util.h",
        ],
        ranks = [1],
        tags = ["gpu"],
        deps = [
            "//comm",
            "@cuda//:lib",
        ],
    )

    # Two simulated machines of one rank, so the hierarchical op exchanges between them.
    env = dict(_ALL_BY_MPI)
    env["WEFT_RANKS_PER_MACHINE"] = "1"
    weft_mpi_program_test(
        name = "nccl_staged_test",
        binary = ":nccl_test_bin",
        env = env,
        ranks = [2],
        tags = ["gpu"],
    )
