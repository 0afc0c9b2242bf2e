#!/usr/bin/env bash
# A library of the C ABI exports exactly the C functions its header declares, none missing:
#   exports_test.sh LIB HEADER [--cxx-weft] [--no-torch]
# --cxx-weft: the library may also export C++ symbols of namespace weft (libweft.so does, for
# libweft_trainer.so), but no other C++ or abseil symbol. --no-torch: the library neither
# needs nor uses LibTorch.
set -euo pipefail
lib=$1
header=$2
shift 2
cxx_weft=0
no_torch=0
for flag in "$@"; do
  case $flag in
    --cxx-weft) cxx_weft=1 ;;
    --no-torch) no_torch=1 ;;
    *) echo "exports_test.sh: unknown flag $flag" >&2; exit 2 ;;
  esac
done
name=$(basename "$lib")
all=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort -u)
exported=$(echo "$all" | grep -v '^_Z' || true)
mangled=$(echo "$all" | grep '^_Z' || true)
# "WEFT_API <type> [*]weft_name(" with the declaration possibly spread over lines.
declared=$(tr '\n' ' ' < "$header" |
  grep -oE 'WEFT_API[[:space:]]+(const[[:space:]]+)?[A-Za-z_][A-Za-z0-9_]*[[:space:]*]+weft_[a-z0-9_]+[[:space:]]*\(' |
  sed -E 's/.*[ *](weft_[a-z0-9_]+)[[:space:]]*\($/\1/' | sort -u)
status=0
stray=$(comm -23 <(echo "$exported") <(echo "$declared"))
if [ -n "$stray" ]; then
  echo "FAIL: $name exports symbols $(basename "$header") does not declare:"
  echo "$stray" | head -20
  status=1
fi
missing=$(comm -13 <(echo "$exported") <(echo "$declared"))
if [ -n "$missing" ]; then
  echo "FAIL: declared in $(basename "$header") but not exported by $name:"
  echo "$missing"
  status=1
fi
if [ -n "$mangled" ]; then
  foreign=$(echo "$mangled" | c++filt | grep -vE '^((vtable|typeinfo|typeinfo name) for )?weft::' || true)
  if [ "$cxx_weft" -eq 0 ]; then
    echo "FAIL: $name exports C++ symbols:"
    echo "$mangled" | c++filt | head -10
    status=1
  elif [ -n "$foreign" ]; then
    echo "FAIL: $name exports C++ symbols outside namespace weft:"
    echo "$foreign" | head -10
    status=1
  fi
fi
if [ "$no_torch" -eq 1 ]; then
  torch_needed=$(readelf -d "$lib" | grep NEEDED | grep -E 'libtorch|libc10' || true)
  torch_used=$(nm -D --undefined-only "$lib" | awk '{print $2}' | c++filt | grep -cE '^(at|c10|torch)::' || true)
  if [ -n "$torch_needed" ] || [ "$torch_used" -ne 0 ]; then
    echo "FAIL: $name depends on LibTorch ($torch_used symbols): $torch_needed"
    status=1
  fi
fi
n=$(echo "$declared" | wc -l)
if [ "$n" -lt 5 ]; then
  echo "FAIL: only $n declarations parsed from $header; the parser is broken"
  status=1
fi
[ "$status" -eq 0 ] && echo "PASS: $name exports exactly the $n functions of $(basename "$header")" \
  "($(echo "$mangled" | grep -c . || true) C++ symbols of namespace weft)"
exit "$status"
