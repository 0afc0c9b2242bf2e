#!/usr/bin/env bash
# Runs a test binary under real Open MPI: mpirun_test.sh NP BINARY [ARGS...]
set -euo pipefail
np=$1
binary=$2
shift 2
# Open MPI keeps its session directory in TMPDIR; Bazel's per-test TMPDIR is too long a
# path for the Unix sockets it creates there.
export TMPDIR=/tmp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Shared memory and loopback only: tests never leave this machine.
export OMPI_MCA_btl=self,vader,tcp
export OMPI_MCA_btl_tcp_if_include=lo
export OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_pml=ob1
# A test that hangs is killed (and fails) rather than holding CI.
timeout_s=${WEFT_TEST_MPI_TIMEOUT:-600}
unset WEFT_TEST_MPI_TIMEOUT  # not a weft setting: the ranks would warn about it
exec mpirun --oversubscribe --bind-to none --timeout "$timeout_s" -np "$np" "$binary" "$@"
