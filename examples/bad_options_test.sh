#!/usr/bin/env bash
# The demos refuse option values that are not whole numbers (exit 2, the option named)
# instead of reading "abc" as 0, and other bad command lines, before starting MPI; --help
# lists the options.
set -uo pipefail
train=$1
consensus=$2
failed=0
expect() { # expect STATUS TEXT COMMAND...
  local status=$1 text=$2 out rc
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  if [[ $rc != "$status" || $out != *"$text"* ]]; then
    echo "FAIL: $*: exit $rc, expected $status with '$text'; output: $out"
    failed=1
  fi
}
expect 2 "--epochs: expected an integer, got 'abc'" "$train" --epochs abc
expect 2 "--batch: expected an integer, got '64x'" "$train" --batch 64x
expect 2 "--lr: expected a number, got 'fast'" "$train" --lr fast
expect 2 "--target: expected a number, got ''" "$train" --target ""
expect 2 "--dim: expected an integer, got '10x'" "$consensus" --dim 10x
expect 2 "--iterations: 0 is out of range" "$consensus" --iterations 0
expect 2 "unknown option --bogus" "$consensus" --bogus 1
expect 2 "--optimizer: expected one of awc, atc" "$train" --optimizer sgd
expect 2 "missing value after --epochs" "$train" --epochs
expect 2 "--quiet takes no value" "$train" --quiet=1
expect 2 "--samples must be at least --batch" "$train" --samples 10 --batch 64
# --help lists every option with its default, and exits 0 without starting MPI.
expect 0 "--epochs N                epochs (default 8)" "$train" --help
expect 0 "--dim N" "$consensus" -h
((failed)) || echo "all checks passed"
exit $failed
