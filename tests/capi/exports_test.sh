#!/usr/bin/env bash
# libweft.so exports exactly the functions the public header declares: nothing else (no
# C++ or abseil symbols leak out), and none of them is missing.
set -euo pipefail
lib=$1
header=$2
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort -u)
# "WEFT_API <type> [*]weft_name(" with the declaration possibly spread over lines.
declared=$(tr '\n' ' ' < "$header" |
  grep -oE 'WEFT_API[[:space:]]+(const[[:space:]]+)?[A-Za-z_][A-Za-z0-9_]*[[:space:]*]+weft_[a-z0-9_]+[[:space:]]*\(' |
  sed -E 's/.*[ *](weft_[a-z0-9_]+)[[:space:]]*\($/\1/' | sort -u)
status=0
stray=$(comm -23 <(echo "$exported") <(echo "$declared"))
if [ -n "$stray" ]; then
  echo "FAIL: libweft.so exports symbols the header does not declare:"
  echo "$stray" | head -20
  status=1
fi
missing=$(comm -13 <(echo "$exported") <(echo "$declared"))
if [ -n "$missing" ]; then
  echo "FAIL: declared in weft.h but not exported:"
  echo "$missing"
  status=1
fi
n=$(echo "$declared" | wc -l)
if [ "$n" -lt 50 ]; then
  echo "FAIL: only $n declarations parsed from $header; the parser is broken"
  status=1
fi
[ "$status" -eq 0 ] && echo "PASS: libweft.so exports exactly the $n functions of weft.h"
exit "$status"
