#!/usr/bin/env bash
# Generates the low-level Go layer (package cweft) from weft.i with SWIG:
#   generate.sh [WEFT_INCLUDE_DIR]
# WEFT_INCLUDE_DIR holds weft/weft.h (default: this repository's capi/include, or
# $WEFT_INCLUDE_DIR). Writes internal/cweft/cweft.go and internal/cweft/weft_wrap.c next to
# this script. Both are checked in, so that users build with `go build` and no SWIG; run
# this after changing weft.i or the headers (the Go binding's test fails on any drift).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
include=${1:-${WEFT_INCLUDE_DIR:-$here/../../capi/include}}
if [[ ! -f "$include/weft/weft.h" ]]; then
  echo "generate.sh: no weft/weft.h under '$include'; pass the directory that holds it" >&2
  exit 1
fi
swig=${SWIG:-swig}
# Relative paths: SWIG writes the interface's path into the output.
(cd "$here" && "$swig" -go -cgo -intgosize 64 -module cweft -I"$include" \
  -outdir internal/cweft -o internal/cweft/weft_wrap.c weft.i)
# SWIG's string copy converts a uintptr back to a pointer, which `go vet` rejects; copy
# the bytes through the string itself instead (the same result, and vet-clean).
/usr/bin/python3 - "$here/internal/cweft/cweft.go" <<'PY'
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
"${GOFMT:-gofmt}" -w "$here/internal/cweft/cweft.go"
