#!/usr/bin/env bash
# Builds //bench:comm_bench (-c opt) and runs it under mpirun for each rank count.
#
#   bench/run.sh                       # 2 then 4 ranks, default sizes (4 B .. 64 MiB)
#   bench/run.sh 2 4 8                 # these rank counts
#   bench/run.sh 2 --max-bytes 1048576 --ops allreduce,fused   # args after the counts
#                                      # go to comm_bench (see comm_bench --help)
#
# After the runs it prints bench/summarize.py's table of them (per rank count and op: the
# added latency at small sizes and the ratios at larger ones, as ranges over the runs).
#
# Environment: COMM_BENCH_RUNS (how many times to run the rank counts in turn, default 1:
# the summary then gives the run-to-run spread), COMM_BENCH_TIMEOUT (seconds per mpirun,
# default 900), BAZEL (default bazel),
# GLIBC_TUNABLES (default: what tools/weftrun gives every rank, `tools/weftrun
# --glibc-tunables`; a tunable you name wins, e.g. glibc.malloc.hugetlb=0 to measure without
# transparent huge pages).
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

# tests/mpirun_test.sh is the one place that knows how weft runs mpirun on this machine
# (session directory, root, oversubscription, shared memory and loopback only).
export WEFT_TEST_MPI_TIMEOUT=${COMM_BENCH_TIMEOUT:-900}
GLIBC_TUNABLES=$(tools/weftrun --glibc-tunables)
export GLIBC_TUNABLES

runs=${COMM_BENCH_RUNS:-1}
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "COMM_BENCH_RUNS must be a positive count" >&2; exit 2; }
status=0
for (( run = 1; run <= runs; run++ )); do
  for np in "${ranks[@]}"; do
    echo "### comm_bench on $np ranks, run $run of $runs ($(nproc) cores on this machine, GLIBC_TUNABLES=$GLIBC_TUNABLES)"
    start=$(date +%s)
    if ! tests/mpirun_test.sh "$np" "$tmpdir/comm_bench" --weft-version "git $version" "$@" \
        | tee -a "$tmpdir/results"; then
      echo "### comm_bench on $np ranks FAILED" >&2
      status=1
    fi
    echo "### $np ranks took $(( $(date +%s) - start )) s"
  done
done
if grep -q '^RESULT ' "$tmpdir/results" 2>/dev/null; then
  echo "### summary of the runs above (bench/summarize.py)"
  python3 bench/summarize.py "$tmpdir/results" || status=1
fi
exit $status
