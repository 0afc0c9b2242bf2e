# Sourced by the Python binding's test scripts: the package from runfiles (or from
# bazel-bin with PYTHONPATH already set), and mpirun as tests/mpirun_test.sh runs it: short
# session paths, root allowed, loopback only.
if [ -d bindings/python/weft ]; then
  export PYTHONPATH="$PWD/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
fi
export TMPDIR=/tmp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo
export OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_pml=ob1
