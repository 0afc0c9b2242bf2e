#!/usr/bin/env bash
# weft across hosts: a 4-host cluster simulated with network namespaces (tools/cluster),
# each host with its own sshd, and jobs started the way a user starts them on a real
# cluster: `weftrun -H h1:2,h2:2 ./program` typed on h1. Checks the process model against
# the hosts, the op suites across hosts (MPI and UCX over TCP), the elastic trainer on 2
# hosts x 4 ranks, and faults: a host's sshd down before launch, a host killed in the
# middle of an op, a link pulled in the middle of an op, a stuck rank whose link then goes,
# and a link that comes back.
# Each fault prints how long it took until the job had ended.
set -uo pipefail

if [[ $(id -u) != 0 ]] || ! ip netns add "weft-probe-$$" 2>/dev/null; then
  echo "SKIPPED: the multi-host tests need root and network namespaces (ip netns add)," \
    "which this machine does not allow"
  exit 0
fi
ip netns del "weft-probe-$$"

CLUSTER=$PWD/tools/cluster
WEFTRUN=$PWD/tools/weftrun
CHECK=tests/cluster/cluster_check
export TMPDIR=/tmp # Open MPI's session directories: Bazel's TMPDIR is too long a path
# Machines come from the hosts here; and weftrun forwards every WEFT_* variable, so the
# test runner's WEFT_NODE_MODULES (not a weft setting) would make every rank warn.
unset WEFT_RANKS_PER_MACHINE WEFT_NODE_MODULES

DIR=$("$CLUSTER" up --hosts 4) || {
  echo "FAILED: could not start the cluster"
  exit 1
}
trap '"$CLUSTER" down "$DIR"' EXIT

passed=0
failed=0
pass() {
  passed=$((passed + 1))
  echo "ok: $*"
}
fail() {
  failed=$((failed + 1))
  echo "FAILED: $*"
}

# on_h1 SECONDS CMD...: CMD on h1 under a time limit; output in $LOG.
LOG=$(mktemp /tmp/weft-cluster-test.XXXXXX)
on_h1() {
  local limit=$1
  shift
  timeout -k 5 "$limit" "$CLUSTER" exec "$DIR" h1 -- "$@" >"$LOG" 2>&1
}

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# --- the process model comes from the real hosts ---------------------------------------
for layout in "h1:2,h2:2 2,2" "h1,h2,h3,h4 1,1,1,1" "h1:2,h2:2,h3:2 2,2,2" "h1:3,h2:1 3,1"; do
  set -- $layout
  if on_h1 60 "$WEFTRUN" -H "$1" "$CHECK" model "$2" && grep -q "model ok" "$LOG"; then
    pass "process model on $1"
  else
    fail "process model on $1"
    cat "$LOG"
  fi
done

# --- every op across hosts --------------------------------------------------------------
# The suites written for one host; the one test that expects a single machine is left out.
suite() { # suite NAME HOSTS BINARY [ENV=VALUE...] [-- GTEST ARGS...]
  local name=$1 hosts=$2 binary=$3
  shift 3
  local -a envs=() args=()
  while (($# > 0)) && [[ $1 != -- ]]; do
    envs+=("$1")
    shift
  done
  [[ ${1:-} == -- ]] && shift
  args=("$@")
  local start
  start=$(now)
  if env "${envs[@]}" timeout -k 5 300 "$CLUSTER" exec "$DIR" h1 -- \
    "$WEFTRUN" -H "$hosts" "${weftrun_opts[@]}" "$binary" "${args[@]}" >"$LOG" 2>&1; then
    pass "$name on $hosts ($(since "$start") s)"
  else
    fail "$name on $hosts"
    grep -E "Failure|FAILED|rror" "$LOG" | head -40
  fi
}
weftrun_opts=()
single_host_only=--gtest_filter=-ProcessModel.QueriesAreConsistent:HierarchicalNeighborAllreduce.OneMachineIsTheLocalAverage
suite "collectives and neighbor ops" h1:2,h2:2 tests/comm_ops_test_bin -- "$single_host_only"
suite "collectives and neighbor ops" h1,h2,h3,h4 tests/comm_ops_test_bin -- "$single_host_only"
# Across hosts the neighbor exchanges and the ring allreduce take weft's TCP transport by
# default; the same on MPI's own point-to-point, and every allreduce on the ring.
suite "collectives and neighbor ops, exchanges on MPI" h1:2,h2:2 tests/comm_ops_test_bin \
  WEFT_EXCHANGE_TRANSPORT=mpi -- "$single_host_only"
suite "collectives and neighbor ops, every allreduce on the TCP ring" h1,h2,h3 \
  tests/comm_ops_test_bin WEFT_RING_ALLREDUCE_BYTES=1 -- "$single_host_only"
suite "neighbor exchanges over UCX" h1:2,h2:2 tests/comm_ops_test_bin \
  WEFT_EXCHANGE_TRANSPORT=ucx -- "$single_host_only"
suite "send/recv and process sets" h1:2,h2:2 tests/comm_p2p_test_bin
suite "hierarchical ops, machines detected" h1:2,h2:2 tests/comm_hierarchical_test_bin
suite "hierarchical ops, machines detected" h1:2,h2:2,h3:2 tests/comm_hierarchical_test_bin
suite "windows on MPI RMA" h1:2,h2:2 tests/comm_window_test_bin
suite "windows on UCX" h1:2,h2:2 tests/comm_window_test_bin WEFT_TRANSPORT=ucx
suite "optimizers, one step" h1:2,h2:2 tests/optim_test_bin -- --gtest_filter=OneStep.*
# The elastic trainer: transitions move layers and optimizer state between the hosts, and
# pipelines stay inside hosts wherever they fit (the test checks placement against the
# ranks' real machines), also when mpirun deals the ranks round-robin over the hosts.
# Each run's final accuracy and layer sums must match a one-host run of the same plan
# (8 ranks on h1 split into two machines of 4).
trainer_results() { grep -o 'TRAINER_RESULT .*' "$LOG" | sort; }
suite "elastic trainer" h1:4,h2:4 tests/trainer_test_bin
trainer_results >"$LOG.two_hosts"
weftrun_opts=(--mpi-args "--map-by node")
suite "elastic trainer, ranks round-robin over the hosts" h1:4,h2:4 tests/trainer_test_bin \
  -- --gtest_filter='Trainer.Transitions*:Trainer.Gossip*'
trainer_results >"$LOG.round_robin"
weftrun_opts=()
suite "elastic trainer, one host as two machines" h1:8 tests/trainer_test_bin \
  WEFT_RANKS_PER_MACHINE=4 -- --gtest_filter='Trainer.Transitions*:Trainer.Gossip*'
trainer_results >"$LOG.one_host"
for run in two_hosts round_robin; do
  if python3 - "$LOG.one_host" "$LOG.$run" <<'PY'; then
import math, sys
def read(path):
    out = {}
    for line in open(path):
        f = line.split()
        kv = dict(x.split("=", 1) for x in f[2:])
        out[f[1]] = (float(kv["accuracy"]), [float(v) for v in kv["layer_sums"].split(",")])
    return out
ref, got = read(sys.argv[1]), read(sys.argv[2])
assert ref and set(ref) <= set(got), (sorted(ref), sorted(got))
for name, (acc, sums) in ref.items():
    acc2, sums2 = got[name]
    assert abs(acc - acc2) <= 1 / 128, (name, acc, acc2)
    for a, b in zip(sums, sums2):
        assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4), (name, sums, sums2)
PY
    pass "elastic trainer ($run): the same accuracy and parameters as on one host"
  else
    fail "elastic trainer ($run) differs from the one-host run"
    cat "$LOG.one_host" "$LOG.$run"
  fi
done
rm -f "$LOG.one_host" "$LOG.two_hosts" "$LOG.round_robin"

# --- faults -----------------------------------------------------------------------------
# A host whose sshd is down: weftrun names it before anything starts.
"$CLUSTER" sshd "$DIR" h3 stop
start=$(now)
if ! on_h1 30 "$WEFTRUN" -H h1,h2,h3 "$CHECK" model 1,1,1 &&
  grep -q "cannot reach h3 over ssh" "$LOG" && ! grep -q "cannot reach h2" "$LOG"; then
  pass "sshd down on h3: weftrun refuses in $(since "$start") s: $(grep -m1 'cannot reach' "$LOG")"
else
  fail "sshd down on h3"
  cat "$LOG"
fi
"$CLUSTER" sshd "$DIR" h3 start

# No interface left for weft's TCP transport: init fails on every rank at once, naming the
# setting, instead of a later op failing on some ranks only.
start=$(now)
if ! on_h1 60 env WEFT_SOCKET_IFNAME=nosuchif "$WEFTRUN" -H h1,h2 "$CHECK" model 1,1 &&
  [[ $(grep -c "WEFT_SOCKET_IFNAME" "$LOG") -ge 2 ]]; then
  pass "no interface for the TCP transport: init fails on both ranks in $(since "$start") s:" \
    "$(grep -m1 -o 'TCP transport: .*' "$LOG" | cut -c1-120)"
else
  fail "no interface for the TCP transport"
  cat "$LOG"
fi

# steps_job HOSTS SECONDS [ENV=VALUE...]: the steps job in the background, from h1.
steps_job() {
  local hosts=$1 seconds=$2
  shift 2
  env "$@" timeout -k 5 120 "$CLUSTER" exec "$DIR" h1 -- \
    "$WEFTRUN" -H "$hosts" "$CHECK" steps "$seconds" >"$LOG" 2>&1 &
  JOB=$!
  local i
  for i in $(seq 300); do
    grep -q "^step 3$" "$LOG" && return 0
    kill -0 "$JOB" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# No rank process may outlive its job, on any host, by more than a few seconds (remote
# daemons end their ranks once they hear the job is over).
leftovers() {
  local i
  for i in $(seq 50); do
    pgrep -f "^$CHECK steps" >/dev/null || return 0
    sleep 0.1
  done
  local pid
  for pid in $(pgrep -f "^$CHECK steps"); do
    printf '%s ' "$(ps -o pid=,stat=,etimes=,args= -p "$pid" | cut -c1-80)"
  done
}

# A host killed (every process on it) in the middle of an op: the job ends.
if steps_job h1,h2,h3,h4 60; then
  start=$(now)
  "$CLUSTER" kill "$DIR" h3
  wait "$JOB"
  status=$?
  took=$(since "$start")
  left=$(leftovers)
  if ((status != 0)) && [[ -z $left ]]; then
    pass "h3 killed mid-op: job ended (status $status) in $took s"
  else
    fail "h3 killed mid-op: status $status after $took s, rank processes left: ${left:-none}"
    tail -20 "$LOG"
  fi
else
  fail "h3 killed mid-op: the job did not start"
  cat "$LOG"
fi
pkill -9 -f "$CHECK steps" 2>/dev/null
"$CLUSTER" sshd "$DIR" h3 start

# A link pulled in the middle of an op, with a stall timeout: no rank waits past it.
if steps_job h1,h2,h3,h4 60 WEFT_STALL_TIMEOUT_SECONDS=5; then
  start=$(now)
  "$CLUSTER" link "$DIR" h2 down
  wait "$JOB"
  status=$?
  took=$(since "$start")
  left=$(leftovers)
  if ((status != 0 && status != 124 && status != 137)) && [[ -z $left ]]; then
    pass "h2's link down mid-op (WEFT_STALL_TIMEOUT_SECONDS=5): job ended (status $status)" \
      "in $took s: $(grep -m1 -E 'watchdog|timed out' "$LOG")"
  else
    fail "h2's link down mid-op: status $status after $took s, rank processes left: ${left:-none}"
    tail -30 "$LOG"
  fi
else
  fail "h2's link down mid-op: the job did not start"
  cat "$LOG"
fi
"$CLUSTER" link "$DIR" h2 up
pkill -9 -f "$CHECK steps" 2>/dev/null
"$CLUSTER" kill "$DIR" h2 # its orted may still wait for the launcher it lost
"$CLUSTER" sshd "$DIR" h2 start

# A rank that stops submitting (SIGSTOP) on a host whose link then goes: the others fail by
# the stall timeout, Open MPI begins to end the job and cannot reach that host's daemon.
rank_on() { # the pid of the steps rank on HOST
  local pid
  for pid in $(ip netns pids "wc$(<"$DIR/id")-$1"); do
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$CHECK steps" && echo "$pid" && return
  done
}
if steps_job h1,h2,h3,h4 60 WEFT_STALL_TIMEOUT_SECONDS=5; then
  stuck=$(rank_on h2)
  kill -STOP "$stuck"
  sleep 1
  start=$(now)
  "$CLUSTER" link "$DIR" h2 down
  wait "$JOB"
  status=$?
  took=$(since "$start")
  # Stopped inside an op (the others then wait for its data: weft's TCP transport fails
  # the transfers, or on MPI the watchdog ends the job) or before submitting it (the
  # coordinator's timeout): either way the job ends.
  if ((status != 0 && status != 124 && status != 137)) &&
    grep -qE "timed out after 5 s \(WEFT_STALL_TIMEOUT_SECONDS\) waiting for rank 1|no data moved for 5 s|watchdog: " "$LOG"; then
    pass "a stuck rank on h2, then h2's link down: job ended (status $status) in $took s"
  else
    fail "a stuck rank on h2, then h2's link down: status $status after $took s"
    tail -30 "$LOG"
  fi
  kill -9 "$stuck" 2>/dev/null
else
  fail "stuck rank: the job did not start"
  cat "$LOG"
fi
"$CLUSTER" link "$DIR" h2 up
pkill -9 -f "$CHECK steps" 2>/dev/null
"$CLUSTER" kill "$DIR" h2
"$CLUSTER" sshd "$DIR" h2 start

# A link that comes back within the stall timeout: the job carries on, every result right.
if steps_job h1,h2,h3,h4 12 WEFT_STALL_TIMEOUT_SECONDS=30; then
  "$CLUSTER" link "$DIR" h2 down
  sleep 3
  "$CLUSTER" link "$DIR" h2 up
  wait "$JOB"
  status=$?
  if ((status == 0)) && grep -q "^done after" "$LOG"; then
    pass "h2's link down for 3 s: the job carried on ($(grep -m1 '^done after' "$LOG"))"
  else
    fail "h2's link down for 3 s: status $status"
    tail -30 "$LOG"
  fi
else
  fail "link comes back: the job did not start"
  cat "$LOG"
fi

rm -f "$LOG"
echo "cluster: $passed passed, $failed failed"
((failed == 0))
