#!/usr/bin/env bash
# Generates the low-level Go layers with SWIG: package cweft from weft.i (weft.h) and
# package cwefttrainer from trainer.i (trainer.h):
#   generate.sh [WEFT_INCLUDE_DIR]
# WEFT_INCLUDE_DIR holds weft/weft.h (default: this repository's capi/include, or
# $WEFT_INCLUDE_DIR). Writes internal/<package>/<package>.go and a *_wrap.c next to it.
# They are checked in, so that users build with `go build` and no SWIG; run this after
# changing an interface or the headers (the Go binding's test fails on any drift).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
include=${1:-${WEFT_INCLUDE_DIR:-$here/../../capi/include}}
if [[ ! -f "$include/weft/weft.h" ]]; then
  echo "generate.sh: no weft/weft.h under '$include'; pass the directory that holds it" >&2
  exit 1
fi
swig=${SWIG:-swig}
for module in cweft:weft cwefttrainer:trainer; do
  package=${module%%:*} interface=${module#*:}
  mkdir -p "$here/internal/$package"
  # Relative paths: SWIG writes the interface's path into the output.
  (cd "$here" && "$swig" -go -cgo -intgosize 64 -module "$package" -I"$include" \
    -outdir "internal/$package" -o "internal/$package/${interface}_wrap.c" "$interface.i")
  # SWIG's string copy converts a uintptr back to a pointer, which `go vet` rejects; copy
  # the bytes through the string itself instead (the same result, and vet-clean).
  /usr/bin/python3 - "$here/internal/$package/$package.go" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
old = "  r := string((*[0x7fffffff]byte)(unsafe.Pointer(p.p))[:p.n])\n"
if old not in text:
    sys.exit("generate.sh: SWIG's swigCopyString changed; update the rewrite here")
text = text.replace(old, "  r := string([]byte(s))\n")
open(path, "w").write(text)
PY
  # gofmt's layout, so that the whole module passes `gofmt -l`.
  "${GOFMT:-gofmt}" -w "$here/internal/$package/$package.go"
done
