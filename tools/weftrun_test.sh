#!/usr/bin/env bash
# Tests for tools/weftrun: the command lines it builds (--dry-run), its errors, its ssh
# check of remote hosts (against a stub ssh, so no network is touched), and one real
# two-rank run under Open MPI on this machine.
#
# Runs under `bazel test //tools:weftrun_test`, or by hand: bash tools/weftrun_test.sh
set -uo pipefail

if [[ -n ${TEST_SRCDIR:-} && -x $TEST_SRCDIR/${TEST_WORKSPACE:-weft}/tools/weftrun ]]; then
  WEFTRUN=$TEST_SRCDIR/${TEST_WORKSPACE:-weft}/tools/weftrun
else
  WEFTRUN=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/weftrun
fi
[[ -x $WEFTRUN ]] || { echo "FAIL: weftrun not found at $WEFTRUN" >&2; exit 1; }

if [[ -n ${TEST_TMPDIR:-} ]]; then
  WORK=$TEST_TMPDIR
else
  WORK=$(mktemp -d)
  trap 'rm -rf -- "$WORK"' EXIT
fi

failures=0
checks=0
fail() {
  printf 'FAIL: %s\n' "$*" >&2
  failures=$((failures + 1))
}

# The outputs of the last `run`.
out="" err="" status=0
run() {
  "$@" >"$WORK/out" 2>"$WORK/err"
  status=$?
  out=$(<"$WORK/out")
  err=$(<"$WORK/err")
}

# expect_word TEXT WORDS DESC: TEXT holds WORDS as whole space-separated words.
expect_words() {
  checks=$((checks + 1))
  [[ " $1 " == *" $2 "* ]] || fail "$3: expected '$2' in: $1"
}
expect_no_words() {
  checks=$((checks + 1))
  [[ " $1 " != *" $2 "* ]] || fail "$3: did not expect '$2' in: $1"
}
expect_text() { # substring match
  checks=$((checks + 1))
  [[ $1 == *"$2"* ]] || fail "$3: expected text '$2' in: $1"
}
expect_status() {
  checks=$((checks + 1))
  [[ $status == "$1" ]] || fail "$2: exit status $status, expected $1 (stderr: $err)"
}

# Same count as weftrun uses (GNU nproc would otherwise honour OMP_NUM_THREADS).
NCPU=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)

# --- the local command line -----------------------------------------------------------

export WEFT_FOO=bar NCCL_DEBUG=INFO WEFTRUN_TEST_UNRELATED=1
# The malloc settings' checks below assume none of the caller's.
unset GLIBC_TUNABLES MALLOC_MMAP_THRESHOLD_ MALLOC_TRIM_THRESHOLD_

run "$WEFTRUN" --dry-run -np 4 ./train --steps 3
expect_status 0 "--dry-run -np 4"
expect_words "$out" "-np 4" "--dry-run -np 4"
expect_words "$out" "--bind-to none" "--dry-run -np 4"
expect_words "$out" "-x WEFT_FOO" "WEFT_* forwarded"
expect_words "$out" "-x NCCL_DEBUG" "NCCL_* forwarded"
expect_words "$out" "-x PATH" "PATH forwarded"
expect_words "$out" "-x WEFTRUN_STDOUT_IS_TTY=0" "output not a terminal"
expect_no_words "$out" "-x WEFTRUN_TEST_UNRELATED" "unrelated variables are not forwarded"
expect_words "$out" \
  "-x GLIBC_TUNABLES=glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=67108864" \
  "weft's malloc settings by default"
expect_words "$out" "./train --steps 3" "program and its arguments come last"
if ((4 > NCPU)); then
  expect_words "$out" "--oversubscribe" "-np 4 on $NCPU CPUs"
else
  expect_no_words "$out" "--oversubscribe" "-np 4 on $NCPU CPUs"
fi
if [[ $(id -u) == 0 ]]; then
  expect_words "$out" "--allow-run-as-root" "running as root"
else
  expect_no_words "$out" "--allow-run-as-root" "not running as root"
fi

run "$WEFTRUN" --dry-run -np 1 true
expect_no_words "$out" "--oversubscribe" "-np 1 never oversubscribes"
run "$WEFTRUN" --dry-run -np "$((NCPU + 1))" true
expect_words "$out" "--oversubscribe" "-np NCPU+1 oversubscribes"
run "$WEFTRUN" --dry-run true
expect_words "$out" "-np $NCPU" "default -np is the number of CPUs"
expect_no_words "$out" "--oversubscribe" "default -np does not oversubscribe"

# The printed line is shell-quoted: reading it back gives the same words.
# shellcheck disable=SC2016 # $HOME must reach weftrun unexpanded
run "$WEFTRUN" --dry-run -np 1 printf '%s|' "a b" "it's" '$HOME'
words=()
eval "words=($out)"
checks=$((checks + 1))
if ((${#words[@]} < 4)) || [[ ${words[-4]} != "%s|" || ${words[-3]} != "a b" || ${words[-2]} != "it's" ||
  ${words[-1]} != "\$HOME" ]]; then
  fail "dry-run quoting does not round-trip: $out"
fi

# --timeline and --verbose pass their values, so the printed line reproduces them.
run "$WEFTRUN" --dry-run --timeline "$WORK/time line.json" -np 2 true
expect_text "$out" "-x 'WEFT_TIMELINE=$WORK/time line.json'" "--timeline"
GLIBC_TUNABLES=glibc.malloc.arena_max=2 run "$WEFTRUN" --dry-run -np 2 true
expect_words "$out" \
  "-x GLIBC_TUNABLES=glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=67108864" \
  "the user's tunables kept, weft's added"
GLIBC_TUNABLES=glibc.malloc.hugetlb=0:glibc.malloc.trim_threshold=1 run "$WEFTRUN" --dry-run -np 2 true
expect_words "$out" \
  "-x GLIBC_TUNABLES=glibc.malloc.hugetlb=0:glibc.malloc.trim_threshold=1:glibc.malloc.mmap_threshold=33554432" \
  "the user's choices win, the tunable they do not name is added"
GLIBC_TUNABLES=glibc.malloc.hugetlb=0:glibc.malloc.mmap_threshold=1:glibc.malloc.trim_threshold=1 \
  run "$WEFTRUN" --dry-run -np 2 true
expect_words "$out" "-x GLIBC_TUNABLES" "tunables that name every setting forwarded as they are"
expect_no_words "$out" "33554432" "tunables that name every setting forwarded as they are"
GLIBC_TUNABLES= MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=65536 run "$WEFTRUN" --glibc-tunables
expect_status 0 "--glibc-tunables"
checks=$((checks + 1))
[[ $out == "glibc.malloc.hugetlb=1" ]] ||
  fail "glibc's older variables keep their thresholds: got '$out'"
MALLOC_TRIM_THRESHOLD_=65536 run "$WEFTRUN" --dry-run -np 2 true
expect_words "$out" "-x MALLOC_TRIM_THRESHOLD_" "glibc's older variable forwarded to remote ranks"
expect_words "$out" "-x GLIBC_TUNABLES=glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=33554432" \
  "no trim threshold of weft's beside the caller's"
GLIBC_TUNABLES=glibc.malloc.arena_max=2 run "$WEFTRUN" --glibc-tunables
expect_text "$out" \
  "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=67108864" \
  "--glibc-tunables prints what the ranks get"
run "$WEFTRUN" --dry-run --verbose -np 2 true
expect_words "$out" "-x WEFT_LOG_LEVEL=debug" "--verbose"

run "$WEFTRUN" --dry-run -np 2 --mpi-args "--mca btl self,tcp   --bind-to core" true
expect_words "$out" "--mca btl self,tcp --bind-to core true" "--mpi-args passed before the program"
expect_no_words "$out" "--bind-to none" "--mpi-args --bind-to replaces the default"

# --- hosts ----------------------------------------------------------------------------

run "$WEFTRUN" --dry-run -H a:2,b:2 python3 train.py
expect_status 0 "-H a:2,b:2"
expect_words "$out" "-H a:2,b:2" "-H passed through"
expect_words "$out" "-np 4" "-H default -np is the slot total"
expect_no_words "$out" "--oversubscribe" "-H a:2,b:2 -np 4"
expect_no_words "$out" "--use-hwthread-cpus" "-H: slots come from the host list"
run "$WEFTRUN" --dry-run -H a:2,b:2 -np 5 true
expect_words "$out" "--oversubscribe" "-np 5 on 4 slots"
run "$WEFTRUN" --dry-run -H a,b:3 true
expect_words "$out" "-H a:1,b:3" "bare host is 1 slot"
expect_words "$out" "-np 4" "bare host is 1 slot"

cat >"$WORK/hosts" <<'EOF'
# training machines
node1 slots=4   # the big one
node2:2

node3
  node4 slots=3
EOF
run "$WEFTRUN" --dry-run --hostfile "$WORK/hosts" true
expect_status 0 "--hostfile"
expect_words "$out" "-np 10" "hostfile slot total is the default -np"
expect_words "$out" "-H node1:4,node2:2,node3:1,node4:3" "hostfile becomes -H"
run "$WEFTRUN" --dry-run --hostfile "$WORK/hosts" -np 11 true
expect_words "$out" "--oversubscribe" "-np 11 on a 10-slot hostfile"

printf 'node1 slots=x\n' >"$WORK/badhosts"
run "$WEFTRUN" --dry-run --hostfile "$WORK/badhosts" true
expect_status 2 "bad hostfile"
expect_text "$err" "badhosts:1" "bad hostfile names the line"
run "$WEFTRUN" --dry-run --hostfile "$WORK/no-such-file" true
expect_status 2 "missing hostfile"

# --- errors ---------------------------------------------------------------------------

run "$WEFTRUN" --mpirun /nonexistent/mpirun -np 1 true
expect_status 127 "--mpirun /nonexistent/mpirun"
expect_text "$err" "weftrun: mpirun not found: install Open MPI (apt-get install openmpi-bin) or pass --mpirun PATH" \
  "missing mpirun message"
run env WEFT_MPIRUN=weft-no-such-mpirun "$WEFTRUN" -np 1 true
expect_status 127 "WEFT_MPIRUN names a missing program"

run "$WEFTRUN" --no-such-option true
expect_status 2 "unknown option"
expect_text "$err" "unknown option '--no-such-option'" "unknown option message"
expect_text "$err" "Usage:" "unknown option prints usage"
run "$WEFTRUN" -np 2
expect_status 2 "missing program"
expect_text "$err" "no program given" "missing program message"
run "$WEFTRUN" -np zero true
expect_status 2 "bad -np"
run "$WEFTRUN" -np
expect_status 2 "-np without a value"
run "$WEFTRUN" --help
expect_status 0 "--help"
expect_text "$out" "Usage: weftrun" "--help prints usage"

# --- the ssh check and the launch, against stubs --------------------------------------

# A stub ssh on PATH: it records its arguments and fails for *.invalid names the way a
# real ssh does, so the check is tested without any network traffic.
mkdir -p "$WORK/bin"
cat >"$WORK/bin/ssh" <<EOF
#!/bin/sh
printf '%s\n' "\$*" >>"$WORK/ssh.log"
for a in "\$@"; do host=\$a; case \$a in *.invalid) echo "ssh: Could not resolve hostname \$a: Name or service not known" >&2; exit 255;; esac; done
exit 0
EOF
# A stub mpirun: prints what it was given and exits with \$FAKE_MPIRUN_STATUS.
cat >"$WORK/bin/fake-mpirun" <<'EOF'
#!/bin/sh
echo "fake-mpirun $*"
echo "env ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-} CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-} LOG=${WEFT_LOG_LEVEL:-} TIMELINE=${WEFT_TIMELINE:-}"
exit "${FAKE_MPIRUN_STATUS:-0}"
EOF
chmod +x "$WORK/bin/ssh" "$WORK/bin/fake-mpirun"
FAKE=$WORK/bin/fake-mpirun
STUBPATH=$WORK/bin:$PATH

rm -f "$WORK/ssh.log"
run env PATH="$STUBPATH" "$WEFTRUN" --mpirun "$FAKE" -H localhost:1,nohost.invalid:1 true
expect_status 1 "unreachable host"
expect_text "$err" "weftrun: cannot reach nohost.invalid over ssh (ssh: Could not resolve hostname nohost.invalid: Name or service not known); mpirun needs passwordless ssh to every host" \
  "unreachable host message"
checks=$((checks + 1))
[[ $out != *fake-mpirun* ]] || fail "mpirun was started although a host is unreachable"
checks=$((checks + 1))
[[ $(cat "$WORK/ssh.log" 2>/dev/null) == "-o BatchMode=yes -o ConnectTimeout=5 nohost.invalid true" ]] ||
  fail "ssh check: expected exactly one 'ssh -o BatchMode=yes -o ConnectTimeout=5 nohost.invalid true', got: $(cat "$WORK/ssh.log" 2>/dev/null)"

rm -f "$WORK/ssh.log"
run env PATH="$STUBPATH" "$WEFTRUN" --mpirun "$FAKE" -H "localhost:1,127.0.0.1:1,$(hostname):1" true
expect_status 0 "local hosts are not checked"
checks=$((checks + 1))
[[ ! -e $WORK/ssh.log ]] || fail "ssh was run for local hosts: $(cat "$WORK/ssh.log")"

rm -f "$WORK/ssh.log"
run env PATH="$STUBPATH" "$WEFTRUN" --no-host-check --mpirun "$FAKE" -H nohost.invalid:2 true
expect_status 0 "--no-host-check"
expect_text "$out" "fake-mpirun" "--no-host-check launches"
checks=$((checks + 1))
[[ ! -e $WORK/ssh.log ]] || fail "--no-host-check still ran ssh: $(cat "$WORK/ssh.log")"

run env PATH="$STUBPATH" "$WEFTRUN" --mpirun "$FAKE" -H reachable.example:2 true
expect_status 0 "reachable remote host"
expect_words "$out" "-H reachable.example:2" "reachable remote host launches"

run env FAKE_MPIRUN_STATUS=7 "$WEFTRUN" --mpirun "$FAKE" -np 1 true
expect_status 7 "exit status is mpirun's"

run "$WEFTRUN" --mpirun "$FAKE" --verbose --timeline /tmp/t.json -np 1 true
expect_text "$err" "weftrun: running: $FAKE" "--verbose prints the mpirun line"
expect_text "$out" "LOG=debug TIMELINE=/tmp/t.json" "--verbose/--timeline set the environment"
if [[ $(id -u) == 0 ]]; then
  expect_text "$out" "ROOT=1 CONFIRM=1" "root: OMPI_ALLOW_RUN_AS_ROOT set"
fi

# --- a real run -----------------------------------------------------------------------

if ! command -v mpirun >/dev/null 2>&1; then
  fail "mpirun is not installed; the real run cannot be tested"
else
  # Open MPI's session directory lives in TMPDIR; Bazel's is too long for its sockets.
  export TMPDIR=/tmp
  LOCAL_ONLY="--mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"
  export WEFT_TEST_VAR=42
  # shellcheck disable=SC2016 # expanded by each rank
  run timeout 120 "$WEFTRUN" -np 2 --mpi-args "$LOCAL_ONLY" -- sh -c 'echo rank=$OMPI_COMM_WORLD_RANK weft=$WEFT_TEST_VAR'
  expect_status 0 "real run"
  checks=$((checks + 1))
  [[ $(printf '%s\n' "$out" | grep -c '^rank=0 weft=42$') == 1 ]] || fail "real run: no 'rank=0 weft=42' line in: $out"
  checks=$((checks + 1))
  [[ $(printf '%s\n' "$out" | grep -c '^rank=1 weft=42$') == 1 ]] || fail "real run: no 'rank=1 weft=42' line in: $out"

  run timeout 120 "$WEFTRUN" -np 1 --mpi-args "$LOCAL_ONLY" -- sh -c 'exit 3'
  expect_status 3 "real run: a rank's exit status comes back"
fi

if ((failures > 0)); then
  printf '%d of %d checks failed\n' "$failures" "$checks" >&2
  exit 1
fi
printf 'all %d checks passed\n' "$checks"
