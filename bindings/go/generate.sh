#!/usr/bin/env bash
# Generates the low-level Go layer (package cweft) from weft.i with SWIG:
#   generate.sh [WEFT_INCLUDE_DIR]
# WEFT_INCLUDE_DIR holds weft/weft.h (default: this repository's capi/include, or
# $WEFT_INCLUDE_DIR). Writes internal/cweft/cweft.go and internal/cweft/weft_wrap.c next to
# this script; they are build outputs (.gitignore), regenerated whenever weft.i changes.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
include=${1:-${WEFT_INCLUDE_DIR:-$here/../../capi/include}}
if [[ ! -f "$include/weft/weft.h" ]]; then
  echo "generate.sh: no weft/weft.h under '$include'; pass the directory that holds it" >&2
  exit 1
fi
swig=${SWIG:-swig}
"$swig" -go -cgo -intgosize 64 -module cweft -I"$include" \
  -outdir "$here/internal/cweft" -o "$here/internal/cweft/weft_wrap.c" "$here/weft.i"
