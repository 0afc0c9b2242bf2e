#!/usr/bin/env bash
# Builds bench/main.go against a libweft.so and runs it under mpirun:
#   run_bench.sh NP LIBWEFT_DIR
# Called by bench/run_binding_bench.sh (the repository's binding benchmark).
set -euo pipefail
np=${1:?usage: run_bench.sh NP LIBWEFT_DIR}
libdir=$(cd "${2:?usage: run_bench.sh NP LIBWEFT_DIR}" && pwd -P)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
root=$(cd "$here/../.." && pwd)
work=$(mktemp -d /tmp/weft_go_bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp -rL "$here" "$work/src"
# shellcheck source=../goenv.sh
source "$here/goenv.sh" "$work" "$root/capi/include" "$libdir"
bash "$work/src/generate.sh" "$root/capi/include"
(cd "$work/src" && go build -o "$work/bench" ./bench)
"$root/tests/mpirun_test.sh" "$np" "$work/bench"
