#!/usr/bin/env bash
# A rank killed in the middle of a transition (tests/pipe/transition_death.cc) on 4 ranks:
# 1. Open MPI's default: mpirun ends the job at once, naming the dead rank; no hang.
# 2. With mpirun --enable-recovery (the job outlives a rank) and a stall timeout: every
#    survivor fails with weft's own error naming what it waited for, exits, and the run
#    ends; no hang.
set -uo pipefail
binary=$1
export TMPDIR=/tmp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_pml=ob1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() {
  echo "FAIL: $*"
  # What every rank said, to tell why.
  [ -d "$out/ranks" ] && tail -n 20 "$out"/ranks/1/rank.*/stderr
  [ -f "$out/recovery.log" ] && tail -n 40 "$out/recovery.log"
  exit 1
}

start=$SECONDS
timeout 120 mpirun --oversubscribe --bind-to none -np 4 "$binary" --victim 3 >"$out/default.log" 2>&1
rc=$?
cat "$out/default.log"
[ "$rc" -ne 124 ] || fail "the default run hung"
[ "$rc" -ne 0 ] || fail "the default run succeeded although rank 3 died"
grep -q "rank 3 dies mid-transition" "$out/default.log" || fail "rank 3 did not die mid-transition"
grep -q "exited on signal 9" "$out/default.log" || fail "mpirun did not name the dead rank"
echo "default: ended in $((SECONDS - start)) s with status $rc"

start=$SECONDS
timeout 120 mpirun --oversubscribe --bind-to none --enable-recovery \
  -x WEFT_STALL_TIMEOUT_SECONDS=3 -np 4 --output-filename "$out/ranks" \
  "$binary" --victim 3 >"$out/recovery.log" 2>&1
rc=$?
[ "$rc" -ne 124 ] || fail "the run with recovery hung"
for r in 0 1 2; do
  log=$(ls "$out"/ranks/1/rank.$r/stderr)
  grep -h "the epoch failed" "$log" || fail "rank $r did not report the failure"
  grep -q "the epoch failed: DEADLINE_EXCEEDED: .*rank" "$log" || fail "rank $r's error names no rank"
done
echo "recovery: every survivor failed with an error and the run ended in $((SECONDS - start)) s"
