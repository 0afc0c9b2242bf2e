#!/usr/bin/env bash
# Builds the Go binding's test binary and runs it under mpirun:
#   go_binding_test.sh NP [go test flags...]
# Bazel runs it as //bindings/go:go_binding_test_np{1,2,4}; it also works by hand from the
# repository root once libweft.so is built (bazel build //capi:libweft.so).
#
# There are no Go rules in this offline Bazel, so the system go and swig do the work here:
# the sources are copied to a scratch directory (runfiles are read-only, and the SWIG layer is
# generated next to them), then `go test -c` builds one binary, which mpirun starts NP times.
set -euo pipefail
np=${1:?usage: go_binding_test.sh NP [go test flags...]}
shift

# Where the workspace's files are: the runfiles tree under Bazel, else this checkout.
if [[ -n "${TEST_SRCDIR:-}" && -n "${TEST_WORKSPACE:-}" ]]; then
  root=$TEST_SRCDIR/$TEST_WORKSPACE
else
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
fi
lib=
for candidate in "${WEFT_LIB_DIR:-}/libweft.so" "$root/capi/libweft.so" \
                 "$root/bazel-bin/capi/libweft.so"; do
  if [[ -f "$candidate" ]]; then
    lib=$(readlink -f "$candidate")
    break
  fi
done
if [[ -z "$lib" ]]; then
  echo "go_binding_test.sh: libweft.so not found; run: bazel build //capi:libweft.so" >&2
  exit 1
fi
libdir=$(dirname "$lib")
include=$root/capi/include

work=${TEST_TMPDIR:-$(mktemp -d)}/go
rm -rf "$work"
mkdir -p "$work/src/internal/cweft" "$work/src/examples/consensus"
src=$root/bindings/go
cp -L "$src"/go.mod "$src"/weft.i "$src"/generate.sh "$src"/*.go "$work/src/"
cp -L "$src"/internal/cweft/doc.go "$work/src/internal/cweft/"
cp -L "$src"/examples/consensus/main.go "$work/src/examples/consensus/"

# A hermetic go command: nothing from the user's environment, no network, no HOME needed.
# shellcheck source=goenv.sh
source "$src/goenv.sh" "$work" "$include" "$libdir"

unformatted=$(cd "$work/src" && "${GOFMT:-gofmt}" -l .)
if [[ -n "$unformatted" ]]; then
  echo "go_binding_test.sh: not gofmt-formatted: $unformatted" >&2
  exit 1
fi
start=$(date +%s.%N)
bash "$work/src/generate.sh" "$include"
# (cweft is SWIG's code: vet would flag its own uintptr conversions.)
(cd "$work/src" && "${GO:-go}" vet . ./examples/... &&
  "${GO:-go}" test -c -o "$work/weft.test" . &&
  "${GO:-go}" build -o "$work/consensus" ./examples/consensus)
echo "go_binding_test.sh: generated and built the test binary and the example in" \
  "$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f s", e - s }')" \
  "($("${GO:-go}" version | cut -d' ' -f3), $("${SWIG:-swig}" -version | awk '/Version/ {print $3}'))"

# The trainer tests' TorchScript model (//tests/capi:trainer_model); not a WEFT_* name, which
# weft would warn about as an unknown setting.
for candidate in "$root/tests/capi/testdata/trainer_model.pt" \
                 "$root/bazel-bin/tests/capi/testdata/trainer_model.pt"; do
  if [[ -f "$candidate" ]]; then
    export GO_TEST_TRAINER_MODEL=$candidate
    break
  fi
done

# mpirun_test.sh gives the project's Open MPI settings (loopback only, oversubscribed).
"$root/tests/mpirun_test.sh" "$np" "$work/weft.test" -test.failfast "$@"
# The example checks its own result (the ranks must agree on the mean).
"$root/tests/mpirun_test.sh" "$np" "$work/consensus" -steps 12
