#!/bin/bash
# weft-plan's exit status and stderr for bad input, run as a user would run it.
set -u
plan="$1"
failures=0

# expect CODE TEXT ARGS...: exit status CODE, TEXT on stderr, nothing on stdout.
expect() {
  local code="$1" text="$2"
  shift 2
  local out err got
  out="$("$plan" "$@" 2> "${TEST_TMPDIR:-/tmp}/err")"
  got=$?
  err="$(cat "${TEST_TMPDIR:-/tmp}/err")"
  if [[ $got -ne $code ]]; then
    echo "FAIL: weft-plan $*: exit $got, expected $code; stderr: $err"
    failures=$((failures + 1))
  elif [[ "$err" != *"$text"* ]]; then
    echo "FAIL: weft-plan $*: stderr lacks '$text': $err"
    failures=$((failures + 1))
  elif [[ -n "$out" ]]; then
    echo "FAIL: weft-plan $*: printed a report despite the error"
    failures=$((failures + 1))
  else
    echo "ok: weft-plan $* -> $got: $err"
  fi
}

expect 1 "expected --alpha in (0, 1]" --model vit-b16 --alpha 1.5
expect 1 "expected --alpha in (0, 1]" --model vit-b16 --alpha 0
expect 2 "--k0: 0 is out of range; expected >= 1" --model vit-b16 --k0 0
expect 1 "expected at most as many stages as units, found K0 = 32 stages for 26 units" \
  --model vit-b16 --machines 4 --k0 32
expect 1 "expected --devices in [1, 16384]" --model vit-b16 --devices -8
expect 1 "line 3: expected params >= 0 (a parameter count), found -4000000" \
  --layers pipe/planner/testdata/bad_params.csv
expect 1 "bad_syntax.json: line 3, column 40: expected a key after ','" \
  --layers pipe/planner/testdata/bad_syntax.json
expect 2 "unknown option --bogus (weft-plan --help lists them)" --model vit-b16 --bogus
expect 2 "expected --model NAME or --layers FILE"

# And a good run exits 0.
if ! "$plan" --model bert-large --machines 2 > /dev/null; then
  echo "FAIL: a good run exited non-zero"
  failures=$((failures + 1))
fi
if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "PASS"
