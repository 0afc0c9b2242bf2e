#!/usr/bin/env bash
# Builds //bench:comm_bench (-c opt) and runs it under mpirun for each rank count.
#
#   bench/run.sh                       # 2 then 4 ranks, default sizes (4 B .. 64 MiB)
#   bench/run.sh 2 4 8                 # these rank counts
#   bench/run.sh 2 --max-bytes 1048576 --ops allreduce,fused   # args after the counts
#                                      # go to comm_bench (see comm_bench --help)
#
# Environment: COMM_BENCH_TIMEOUT (seconds per mpirun, default 900), BAZEL (default bazel).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

ranks=()
while [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; do
  ranks+=("$1")
  shift
done
[[ ${#ranks[@]} -gt 0 ]] || ranks=(2 4)

"${BAZEL:-bazel}" build -c opt //bench:comm_bench
binary=$("${BAZEL:-bazel}" info -c opt bazel-bin 2>/dev/null)/bench/comm_bench
# The bench is run from a copy: the bazel-bin output can be replaced by a concurrent build.
tmpdir=$(mktemp -d /tmp/comm_bench.XXXXXX)
trap 'rm -rf "$tmpdir"' EXIT
cp "$binary" "$tmpdir/comm_bench"

version=$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)

# The same MPI environment as tests/mpirun_test.sh: Open MPI's session directory in /tmp
# (short Unix socket paths), root allowed, oversubscription allowed, and shared memory plus
# loopback only.
export TMPDIR=/tmp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader,tcp
export OMPI_MCA_btl_tcp_if_include=lo
export OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_pml=ob1
timeout_s=${COMM_BENCH_TIMEOUT:-900}

status=0
for np in "${ranks[@]}"; do
  echo "### comm_bench on $np ranks ($(nproc) cores on this machine)"
  start=$(date +%s)
  if ! mpirun --oversubscribe --bind-to none --timeout "$timeout_s" -np "$np" \
      "$tmpdir/comm_bench" --weft-version "git $version" "$@"; then
    echo "### comm_bench on $np ranks FAILED" >&2
    status=1
  fi
  echo "### $np ranks took $(( $(date +%s) - start )) s"
done
exit $status
