# Sourced by the Python binding's test scripts. Under Bazel (the package in runfiles), the
# tests use weft as a user installs it: a wheel packed from the built package
# (build_backend.py), installed with pip into a fresh virtual environment that sees
# Debian's NumPy, torch and pytest; $PYTHON is that environment's interpreter. By hand from
# the repository root, with PYTHONPATH=bazel-bin/bindings/python set, $PYTHON is Debian's.
# mpirun runs as tests/mpirun_test.sh runs it: short session paths, root allowed, loopback
# only.
PYTHON=/usr/bin/python3
if [ -d bindings/python/weft ] && [ -n "${TEST_TMPDIR:-}" ]; then
  wheel=$(/usr/bin/python3 bindings/python/build_backend.py bindings/python/weft \
    "$TEST_TMPDIR/wheel")
  /usr/bin/python3 -m venv --system-site-packages --without-pip "$TEST_TMPDIR/venv"
  /usr/bin/python3 -m pip --python "$TEST_TMPDIR/venv/bin/python" install --quiet \
    --no-index --no-deps --root-user-action=ignore "$wheel"
  PYTHON=$TEST_TMPDIR/venv/bin/python
  export WEFT_TEST_INSTALLED="$TEST_TMPDIR/venv"
fi
export PYTHON
export TMPDIR=/tmp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo
export OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_pml=ob1
