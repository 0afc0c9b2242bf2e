#!/usr/bin/env bash
# The Python binding's tests on N ranks, through weft's own launcher:
#   run_pytest.sh N
# Run from the runfiles root (Bazel does), or from the repository root after
# `bazel build //bindings/python:weft` with PYTHONPATH=bazel-bin/bindings/python.
set -euo pipefail
np=$1
if [ -d bindings/python/weft ]; then
  export PYTHONPATH="$PWD/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
fi
# As tests/mpirun_test.sh: short session paths, root allowed, loopback only.
export TMPDIR=/tmp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo
export OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_pml=ob1
# A rank that fails an assertion stops calling collectives; the others then get a stall
# error instead of waiting forever.
export WEFT_STALL_TIMEOUT_SECONDS=${WEFT_STALL_TIMEOUT_SECONDS:-120}
# pytest's temporary directories per rank would collide under one basetemp.
exec tools/weftrun -np "$np" --no-host-check \
  --mpi-args "--oversubscribe --bind-to none --timeout 900" -- \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider --color=no bindings/python/tests
