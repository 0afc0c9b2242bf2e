#!/usr/bin/env bash
# Builds //bench:window_bench (-c opt) and runs it on 2 ranks under mpirun, with weft's
# choice of MPI one-sided component (osc/ucx, see comm/README.md) applied to the raw RMA
# baseline too, so both use the same transport.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
"${BAZEL:-bazel}" build -c opt //bench:window_bench
binary=$("${BAZEL:-bazel}" info -c opt bazel-bin 2>/dev/null)/bench/window_bench
tmp=$(mktemp -d /tmp/window_bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cp "$binary" "$tmp/"
export WEFT_TEST_MPI_TIMEOUT=${WINDOW_BENCH_TIMEOUT:-900}
echo "### window_bench on 2 ranks ($(nproc) cores on this machine)"
tests/mpirun_test.sh 2 "$tmp/window_bench"
