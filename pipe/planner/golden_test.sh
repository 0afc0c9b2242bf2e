#!/bin/bash
# Compares weft-plan's report for ViT-B/16 on 2 machines x 8 devices, 10 epochs, with the
# reviewed golden file. After an intended change, regenerate it with
#   bazel run //pipe/planner:weft-plan -- --model vit-b16 --machines 2 --devices 8 \
#     --epochs 10 > pipe/planner/testdata/vit_b16.golden
# and review the diff line by line (pipe/planner/README.md says what to look for).
set -u
plan="$1"
golden="$2"
actual="${TEST_TMPDIR:-/tmp}/vit_b16.actual"
if ! "$plan" --model vit-b16 --machines 2 --devices 8 --epochs 10 > "$actual"; then
  echo "FAIL: weft-plan exited with $?" >&2
  exit 1
fi
if ! diff -u "$golden" "$actual"; then
  echo "FAIL: the report differs from $golden (diff above: - golden, + now)." >&2
  echo "If the change is intended, regenerate the golden file (see the top of this script)." >&2
  exit 1
fi
echo "PASS: the report matches $golden"
