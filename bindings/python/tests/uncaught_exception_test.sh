#!/usr/bin/env bash
# Rank 0 raises an exception nobody catches while rank 1 waits in an allreduce that rank 0
# never calls, with no stall timeout: the job must end at once, showing the traceback,
# instead of hanging in weft's collective shutdown at exit.
set -uo pipefail
# shellcheck source=bindings/python/tests/launch_env.sh
source bindings/python/tests/launch_env.sh
unset WEFT_STALL_TIMEOUT_SECONDS
start=$(date +%s)
out=$(timeout 120 tools/weftrun -np 2 --no-host-check --mpi-args "--oversubscribe --bind-to none" \
  -- "$PYTHON" -c '
import numpy as np
import weft
weft.init()
if weft.rank() == 0:
    raise RuntimeError("boom on rank 0")
weft.allreduce(np.ones(3), name="never.matched")
' 2>&1)
rc=$?
elapsed=$(($(date +%s) - start))
printf '%s\n' "$out"
fail() { echo "FAIL: $*"; exit 1; }
((rc == 124)) && fail "the job hung (killed by timeout after 120 s)"
((rc == 0)) && fail "the job exited 0"
grep -q "RuntimeError: boom on rank 0" <<<"$out" || fail "no traceback"
grep -q "weft: rank 0 ends the job: an uncaught RuntimeError" <<<"$out" || fail "no word from weft"
((elapsed < 20)) || fail "took ${elapsed} s"
echo "ok: the job ended in ${elapsed} s with exit status ${rc}"
