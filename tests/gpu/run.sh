#!/usr/bin/env bash
# Runs weft's GPU tests in one go and prints a summary. Use it on a machine with a CUDA
# device (CI has none: there the same tests skip).
#
#   tests/gpu/run.sh [extra bazel test flags...]
#
# What runs (tests/gpu/BUILD.bazel):
#   kernels_test           the backend's device kernels (averages, weighted sums) against
#                          the CPU kernels, byte for byte;
#   nccl_test_np1          every op on CUDA tensors through the NCCL backend, one rank;
#   nccl_staged_test_np2   the same tests on two ranks with every WEFT_<OP>_BY_MPI=1, i.e.
#                          CUDA tensors staged through host memory and run on MPI.
# NCCL refuses two ranks on one GPU, and every rank uses cuda:0 (the coordinator requires
# the same device on every rank), so multi-rank NCCL is not exercised here; kernels_test
# covers the arithmetic such runs would add (the average's division).
#
# Exit status: 0 if every test passed and none skipped for want of a device, 1 otherwise. Needs CUDA and NCCL where the build looks for them (WEFT_CUDA_HOME, default
# /usr/local/cuda); without them the GPU targets do not exist and this says so.
set -uo pipefail
cd "$(dirname "$0")/../.."

bazel_flags=(--disk_cache="$HOME/.cache/weft/bazel-disk")

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader |
    sed 's/^/GPU: /'
else
  echo "warning: nvidia-smi not found; the device tests will probably skip" >&2
fi

targets=$(bazel query "${bazel_flags[@]}" 'tests(//tests/gpu/...)' 2>/dev/null)
if [ -z "$targets" ]; then
  echo "no GPU test targets: the build did not find CUDA with NCCL (set WEFT_CUDA_HOME)" >&2
  exit 1
fi

bazel test "${bazel_flags[@]}" --cache_test_results=no --test_output=errors "$@" $targets
bazel_rc=$?

# Summary from each test's log (rank 0 prints the full GoogleTest report).
testlogs=$(bazel info "${bazel_flags[@]}" bazel-testlogs 2>/dev/null)
status=$bazel_rc
echo
echo "=== weft GPU tests ==="
for t in $targets; do
  log="$testlogs/${t#//}"
  log="${log/://}/test.log"
  if [ ! -f "$log" ]; then
    echo "$t: no log (did it build?)"
    status=1
    continue
  fi
  passed=$(grep -m1 -o '\[  PASSED  \] [0-9]* test' "$log" | grep -o '[0-9]*' || true)
  skipped=$(grep -m1 -o '\[  SKIPPED \] [0-9]* test' "$log" | grep -o '[0-9]*' || true)
  failed=$(grep -m1 -o '\[  FAILED  \] [0-9]* test' "$log" | grep -o '[0-9]*' || true)
  echo "$t: passed ${passed:-0}, skipped ${skipped:-0}, failed ${failed:-0}"
  # Some tests skip by design (pair_gossip on one rank); skipping for want of a device is
  # a failure of this script.
  if grep -q 'no CUDA device' "$log"; then
    grep -m1 'no CUDA device' "$log" | sed 's/^/    /'
    status=1
  fi
  [ -n "$failed" ] && [ "$failed" != 0 ] && status=1
done
if [ "$status" = 0 ]; then echo "all GPU tests passed"; else echo "GPU tests: NOT all passed"; fi
exit "$status"
