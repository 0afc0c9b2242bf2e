#!/usr/bin/env bash
# Builds the Go binding's test binary and runs it under mpirun:
#   go_binding_test.sh NP [go test flags...]
# Bazel runs it as //bindings/go:go_binding_test_np{1,2,4}; it also works by hand from the
# repository root once the libraries are built (bazel build //capi:weft).
#
# There are no Go rules in this offline Bazel, so the system go does the work here: the
# sources are copied to a scratch directory (runfiles are read-only), the checked-in SWIG
# layer is compared with a fresh generation (the only use of swig), the module is vetted,
# then `go test -c` builds one binary, which mpirun starts NP times.
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
  echo "go_binding_test.sh: libweft.so not found; run: bazel build //capi:weft" >&2
  exit 1
fi
libdir=$(dirname "$lib")
include=$root/capi/include

work=${TEST_TMPDIR:-$(mktemp -d)}/go
rm -rf "$work"
src=$root/bindings/go
# The module as its sources list it (//bindings/go:sources), directories and all.
(cd "$src" && find -L . -type f \( -name '*.go' -o -name '*.c' -o -name '*.i' -o \
  -name go.mod -o -name generate.sh \) ! -path './bench/*' -print0) |
  while IFS= read -r -d '' f; do
    mkdir -p "$work/src/$(dirname "$f")"
    cp -L "$src/$f" "$work/src/$f"
  done

# A hermetic go command: nothing from the user's environment, no network, no HOME needed.
# shellcheck source=goenv.sh
source "$src/goenv.sh" "$work" "$include" "$libdir"

unformatted=$(cd "$work/src" && "${GOFMT:-gofmt}" -l .)
if [[ -n "$unformatted" ]]; then
  echo "go_binding_test.sh: not gofmt-formatted: $unformatted" >&2
  exit 1
fi
# The checked-in SWIG layers must be what the interfaces and the headers generate today.
mkdir -p "$work/regen"
cp "$work/src/generate.sh" "$work/src"/*.i "$work/regen/"
bash "$work/regen/generate.sh" "$include"
for f in cweft/cweft.go cweft/weft_wrap.c cwefttrainer/cwefttrainer.go \
         cwefttrainer/trainer_wrap.c; do
  if ! cmp -s "$work/regen/internal/$f" "$work/src/internal/$f"; then
    echo "go_binding_test.sh: bindings/go/internal/$f is stale; run" \
      "bindings/go/generate.sh" >&2
    diff "$work/src/internal/$f" "$work/regen/internal/$f" | head -20 >&2
    exit 1
  fi
done
# No SWIG from here on: the build uses the checked-in layers, as a user's does.
start=$(date +%s.%N)
(cd "$work/src" && "${GO:-go}" vet ./... &&
  "${GO:-go}" test -c -o "$work/weft.test" . &&
  "${GO:-go}" test -c -o "$work/trainer.test" ./trainer &&
  "${GO:-go}" build -o "$work/consensus" ./examples/consensus)
# Only the trainer package links the trainer's library (and LibTorch).
if ldd "$work/consensus" | grep -qE 'libweft_trainer|libtorch'; then
  echo "go_binding_test.sh: a program without the trainer package links the trainer" >&2
  exit 1
fi
echo "go_binding_test.sh: vetted and built the module, the test binary and the example in" \
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
"$root/tests/mpirun_test.sh" "$np" "$work/trainer.test" -test.failfast "$@"
# The example checks its own result (the ranks must agree on the mean).
"$root/tests/mpirun_test.sh" "$np" "$work/consensus" -steps 12
