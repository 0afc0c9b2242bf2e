#!/usr/bin/env bash
# bench/summarize.py over two made-up runs of comm_bench: each row's ranges span both runs,
# the sizes fall into the right columns, the fused case is read against its ideal, and no
# RESULT line is an error.
set -euo pipefail
summarize=${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-weft}/bench/summarize.py
[[ -f $summarize ]] || summarize=bench/summarize.py
dir=${TEST_TMPDIR:-$(mktemp -d)}

result() {  # op ranks bytes weft_us mpi_us
  printf 'RESULT {"op": "%s", "ranks": %s, "bytes": %s, "weft_us": %s, "mpi_us": %s, "ratio": %s}\n' \
    "$1" "$2" "$3" "$4" "$5" "$(python3 -c "print(round($5 / $4, 4))")"
}
{
  echo "### comm_bench on 2 ranks, run 1 of 2"
  result allreduce 2 4 3.0 1.0        # added 2.0
  result allreduce 2 4096 4.0 1.0     # added 3.0: the worst size
  result allreduce 2 8192 10.0 9.0    # ratio 0.9
  result allreduce 2 1048576 100.0 150.0
  echo 'RESULT {"op": "fused_allreduce_64x4KiB", "ranks": 2, "bytes": 262144, "weft_us": 90.0, "mpi_us": 200.0, "ratio": 2.2, "weft_grouped_us": 80.0, "mpi_one_buffer_us": 40.0}'
  echo "### comm_bench on 2 ranks, run 2 of 2"
  result allreduce 2 4 2.0 1.0        # added 1.0
  result allreduce 2 4096 3.0 1.0     # added 2.0
  result allreduce 2 8192 8.0 10.0    # ratio 1.25
  result allreduce 2 1048576 100.0 90.0
  echo 'RESULT {"op": "fused_allreduce_64x4KiB", "ranks": 2, "bytes": 262144, "weft_us": 60.0, "mpi_us": 200.0, "ratio": 3.3, "weft_grouped_us": 50.0, "mpi_one_buffer_us": 40.0}'
} > "$dir/runs.log"

out=$(python3 "$summarize" "$dir/runs.log")
echo "$out"
expect() {
  grep -qF -- "$1" <<<"$out" || { echo "FAIL: missing: $1" >&2; exit 1; }
}
# Median of the small sizes per run: 2.5 and 1.5; worst: 3.0 and 2.0.
expect "| 2 | allreduce | 2 | 1.5 to 2.5 | 2.0 to 3.0 | 0.90 to 1.25 (lowest at 8 KiB) | 0.90 to 1.50 (lowest at 1 MiB) |"
expect "fused_allreduce_64x4KiB on 2 ranks (2 runs): weft's burst took 1.50 to 2.25x one MPI_Allreduce of all its bytes, 1.25 to 2.00x in a group"

# The same from stdin, and nothing to summarize is an error.
[[ $(python3 "$summarize" < "$dir/runs.log") == "$out" ]] || { echo "FAIL: stdin differs" >&2; exit 1; }
if echo "no results" | python3 "$summarize" 2>/dev/null; then
  echo "FAIL: no RESULT lines should fail" >&2
  exit 1
fi
echo PASS
