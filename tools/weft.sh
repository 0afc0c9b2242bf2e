#!/usr/bin/env bash
# One entry point for a new machine: installs what is missing from Debian 12's packages,
# builds with Bazel (offline), then runs the demo or the whole test suite.
#
#   ./tools/weft.sh demo    # set up, build, train the demo network on 4 ranks (options after it)
#   ./tools/weft.sh test    # set up, build, run every test (what CI runs)
#   ./tools/weft.sh sanitize  # the C++ tests under ASan+UBSan, the engine's under TSan
#   ./tools/weft.sh install --prefix DIR  # set up, build, install headers, libraries,
#                                         # pkg-config files, the Python package, tools
#   ./tools/weft.sh setup   # only install the packages
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  bazel-bootstrap bazel-rules-java g++ python3
  libtorch-dev libopenmpi-dev openmpi-bin
  libabsl-dev libgtest-dev libgmock-dev libdlpack-dev
  libucx-dev ucx-utils python3-dev
  swig golang-go python3-numpy python3-torch python3-pytest python3-networkx
  libopenblas0-openmp
)
# libopenblas0-openmp: Debian's LibTorch does its matrix products through the system BLAS,
# which is the reference implementation unless an optimized one is installed: with it the
# training examples run about 6x faster. The OpenMP build follows torch::set_num_threads,
# so ranks sharing a machine do not oversubscribe its cores.
# The multi-host tests (tests/cluster) start their own sshd in each simulated host; the
# install test builds C programs with pkg-config.
TEST_PACKAGES=(openssh-server openssh-client iproute2 pkg-config)

setup() {
  local missing=() wanted=("${PACKAGES[@]}")
  [ "${1:-}" != test ] || wanted+=("${TEST_PACKAGES[@]}")
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "weft: installing ${missing[*]}"
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    "${sudo[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends \
      "${missing[@]}"
  fi
  # Only the tests need tree-sitter (the Julia binding's check).
  [ "${1:-}" != test ] || setup_tree_sitter
}

# The Julia binding's test parses Julia source with tree-sitter, since Julia itself is not
# packaged for Debian 12. npm serves prebuilt modules; they live in a per-user cache (not
# the workspace) and are handed to the test as WEFT_NODE_MODULES.
WEFT_NODE_DIR="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/weft/node"
setup_tree_sitter() {
  local node_check='require("tree-sitter"); require("tree-sitter-julia")'
  if command -v node >/dev/null &&
    NODE_PATH="$WEFT_NODE_DIR/node_modules" node -e "$node_check" 2>/dev/null; then
    return 0
  fi
  if ! command -v npm >/dev/null; then
    echo "weft: installing nodejs npm"
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    "${sudo[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends \
      nodejs npm
  fi
  echo "weft: installing tree-sitter and tree-sitter-julia into $WEFT_NODE_DIR"
  mkdir -p "$WEFT_NODE_DIR"
  # tree-sitter-julia 0.23 declares a peer dependency on a newer tree-sitter than the 0.21
  # it works with, hence --legacy-peer-deps.
  # Node trusts only its own CA list; behind a TLS-inspecting proxy whose CA is installed
  # system-wide (update-ca-certificates), npm needs the system bundle too.
  local ca=/etc/ssl/certs/ca-certificates.crt
  NODE_EXTRA_CA_CERTS="${NODE_EXTRA_CA_CERTS:-$([ -f "$ca" ] && echo "$ca")}" \
    npm install --prefix "$WEFT_NODE_DIR" --legacy-peer-deps --no-audit --no-fund \
    tree-sitter@0.21.1 tree-sitter-julia@0.23.1
  NODE_PATH="$WEFT_NODE_DIR/node_modules" node -e "$node_check"
}

# Reuse earlier build outputs on this machine (CI clones into a fresh folder each time).
BAZEL_FLAGS=(--disk_cache="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/weft/bazel-disk")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Two parts: decentralized training of an MLP (examples/train.cc; the options after `demo`
# go to it, DEMO_RANKS ranks), then elastic pipelining of a small ViT with progressive
# freezing, compared with the same training without freezing (examples/pipe/vit_pipe.cc,
# DEMO_PIPE_RANKS ranks; DEMO_PIPE=0 skips it).
demo() {
  local pipe=${DEMO_PIPE:-1}
  local -a targets=(//examples:train)
  [ "$pipe" = 0 ] || targets+=(//examples/pipe:vit_pipe)
  bazel build "${BAZEL_FLAGS[@]}" "${targets[@]}"
  local mpi_args="--mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"
  [ "$pipe" = 0 ] || echo "== demo 1/2: decentralized training of an MLP (examples/train.cc)"
  TMPDIR=/tmp tools/weftrun -np "${DEMO_RANKS:-4}" --mpi-args "$mpi_args" \
    bazel-bin/examples/train "$@"
  [ "$pipe" = 0 ] && return 0
  echo
  echo "== demo 2/2: elastic pipeline with progressive freezing (examples/pipe/vit_pipe.cc)"
  TMPDIR=/tmp tools/weftrun -np "${DEMO_PIPE_RANKS:-8}" --mpi-args "$mpi_args" \
    bazel-bin/examples/pipe/vit_pipe --compare
}

run_tests() {
  local log
  log=$(mktemp)
  set +e
  # Tests always run (never results cached from an earlier run); one line per target.
  bazel test "${BAZEL_FLAGS[@]}" --nocache_test_results --test_summary=short \
    --test_env=WEFT_NODE_MODULES="$WEFT_NODE_DIR/node_modules" \
    --test_env=CONSUMER_BAZEL_CACHE="${HOME:-/tmp}/.cache/weft/consumer" //... "$@" 2>&1 |
    tee "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  # A plain closing line, counted from Bazel's per-target summary.
  local passed failed
  passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log" || true)
  failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|FLAKY)' "$log" || true)
  # The fast part of `sanitize`.
  set +e
  bazel test "${BAZEL_FLAGS[@]}" --config=asan --nocache_test_results --test_summary=short \
    -- "${SANITIZE_FAST_TARGETS[@]}" 2>&1 | tee "$log"
  local asan_rc=${PIPESTATUS[0]}
  set -e
  local asan_passed asan_failed
  asan_passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log" || true)
  asan_failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|FLAKY)' "$log" || true)
  rm -f "$log"
  echo "tests: ${passed} passed, ${failed} failed; under ASan+UBSan: ${asan_passed} passed," \
    "${asan_failed} failed"
  ((rc != 0)) && return "$rc"
  return "$asan_rc"
}

# Builds the libraries, the Python package and the tools (optimized), then lays them out
# under --prefix (tools/install.sh says what goes where).
install_weft() {
  local prefix=
  while (($#)); do
    case $1 in
      --prefix) prefix=$2; shift ;;
      *) echo "usage: $0 install --prefix DIR" >&2; return 2 ;;
    esac
    shift
  done
  [[ -n "$prefix" ]] || { echo "usage: $0 install --prefix DIR" >&2; return 2; }
  bazel build "${BAZEL_FLAGS[@]}" -c opt //capi:weft //bindings/python:weft \
    //pipe/planner:weft-plan
  tools/install.sh --prefix "$prefix" --outputs "$(bazel info "${BAZEL_FLAGS[@]}" -c opt bazel-bin)"
}

# The sanitizers: every C++ test (single-process and under mpirun) built with
# AddressSanitizer and UndefinedBehaviorSanitizer, then the engine's multi-threaded tests
# with ThreadSanitizer. The bindings, benchmarks and the multi-host, consumer and install
# tests load uninstrumented interpreters or build on their own (the install test links a
# program against the installed library without the sanitizer's runtime), and are left out.
SANITIZE_TARGETS=(//core/... //comm/... //optim/... //pipe/... //capi/... //examples/...
  //tests/...  -//tests/cluster/... -//tests:consumer_test -//tests/install/...)
TSAN_TARGETS=(//comm:coordinator_test //tests:comm_errors_test_np2 //tests:comm_errors_test_np4
  //tests:comm_ops_test_np2 //tests:comm_ops_test_np4 //tests:comm_window_test_np2
  //tests:comm_p2p_test_np2 //tests:comm_ops_tcp_test_np2 //tests:comm_mixed_ops_test_np3
  //tests:comm_window_mixed_test_np3 //comm:byte_ring_test //tests:comm_control_channel_test_np2)
# What `test` (and so CI) runs of it: the single-process tests of core/ and comm/ under
# ASan+UBSan, a couple of minutes from nothing and seconds once cached.
SANITIZE_FAST_TARGETS=(//core/... //comm/...)
sanitize() {
  bazel test "${BAZEL_FLAGS[@]}" --config=asan --nocache_test_results --test_summary=short \
    -- "${SANITIZE_TARGETS[@]}" "$@"
  bazel test "${BAZEL_FLAGS[@]}" --config=tsan --nocache_test_results --test_summary=short \
    --test_env=TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tools/tsan.supp" \
    -- "${TSAN_TARGETS[@]}" "$@"
}

case "${1:-}" in
  setup) setup test ;;
  sanitize) shift; setup test; sanitize "$@" ;;
  demo) shift; setup; demo "$@" ;;
  test) shift; setup test; run_tests "$@" ;;
  install) shift; setup; install_weft "$@" ;;
  *)
    echo "usage: $0 demo|test|sanitize|install|setup" >&2
    exit 2
    ;;
esac
