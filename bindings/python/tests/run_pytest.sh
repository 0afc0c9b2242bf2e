#!/usr/bin/env bash
# The Python binding's tests on N ranks, through weft's own launcher:
#   run_pytest.sh N
# Run from the runfiles root (Bazel does), or from the repository root after
# `bazel build //bindings/python:weft` with PYTHONPATH=bazel-bin/bindings/python.
set -euo pipefail
np=$1
# shellcheck source=bindings/python/tests/launch_env.sh
source bindings/python/tests/launch_env.sh
# A rank that fails an assertion stops calling collectives; the others then get a stall
# error instead of waiting forever.
export WEFT_STALL_TIMEOUT_SECONDS=${WEFT_STALL_TIMEOUT_SECONDS:-120}
# pytest's temporary directories per rank would collide under one basetemp.
exec tools/weftrun -np "$np" --no-host-check \
  --mpi-args "--oversubscribe --bind-to none --timeout 900" -- \
  "$PYTHON" -m pytest -q -p no:cacheprovider --color=no bindings/python/tests
