#!/usr/bin/env bash
# The elastic pipeline against the static one on the demo ViT (examples/pipe), 8 MPI ranks
# on this machine (oversubscribed), in one run: static (no freezing, K = 8 fixed), then the
# ablation (freeze only; + AutoPipe; + AutoDP; + AutoCache = the full system). Per row:
# training time (steps + transitions, evaluation excluded), speedup over static, time to the
# target test accuracy, final accuracy, and the planner's predicted speedup for the same
# configuration (pipe/planner's cost model on the ViT's per-group parameter counts, this run's
# batch, micro-batches, alpha and epochs, the FLOP/s measured on one rank, and the machine's
# cores as the compute all ranks share).
#
#   bench/pipe_bench.sh [pipe_bench flags...]     (bench/pipe_bench.cc lists them)
#
# Environment: PIPE_BENCH_RANKS (8), PIPE_BENCH_TIMEOUT (1200 s, mpirun --timeout).
# About 10 minutes on the 2-core development VM. Not part of CI.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
ranks=${PIPE_BENCH_RANKS:-8}
cores=$(nproc --all)  # before OMP_NUM_THREADS=1, which nproc honours
disk_cache=(--disk_cache="$HOME/.cache/weft/bazel-disk")
"${BAZEL:-bazel}" build -c opt "${disk_cache[@]}" //bench:pipe_bench >&2
binary=$("${BAZEL:-bazel}" info -c opt bazel-bin 2>/dev/null)/bench/pipe_bench
tmp=$(mktemp -d /tmp/pipe_bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cp "$binary" "$tmp/"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TMPDIR=/tmp OMP_NUM_THREADS=1
mpi_args="--oversubscribe --bind-to none --timeout ${PIPE_BENCH_TIMEOUT:-1200}"
mpi_args+=" --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"
tools/weftrun -np "$ranks" --mpi-args "$mpi_args" "$tmp/pipe_bench" "$@" | tee "$tmp/out" |
  grep -E '^(EPOCH|CALIBRATION)' >&2

field() { echo "$1" | grep -o "$2=[^ ]*" | head -1 | cut -d= -f2 | tr -d '"'; }
label() { echo "$1" | sed 's/.*label="\([^"]*\)".*/\1/'; }
static=$(grep '^ROW config=static ' "$tmp/out" || true)
[ -n "$static" ] || { echo "pipe_bench: no static row (see the output above)" >&2; exit 1; }
static_s=$(field "$static" train_s)
cal=$(grep '^CALIBRATION' "$tmp/out")

echo
echo "### pipe_bench: demo ViT ($(field "$cal" groups) groups, $(field "$cal" params) parameters), $ranks ranks on $cores cores, K0 = 8"
printf '%-28s %9s %10s %8s %11s %9s %10s\n' configuration train_s samples/s speedup \
  to_target_s accuracy predicted
while read -r row; do
  t=$(field "$row" train_s)
  tt=$(field "$row" to_target_s)
  tt=$(awk -v x="$tt" 'BEGIN { if (x < 0) print "not reached"; else printf "%.1f", x }')
  sp=$(awk -v a="$static_s" -v b="$t" 'BEGIN { printf "%.2fx", a / b }')
  printf '%-28s %9.1f %10s %8s %11s %9s %9.2fx\n' "$(label "$row")" "$t" \
    "$(field "$row" samples_per_s)" "$sp" "$tt" "$(field "$row" accuracy)" \
    "$(field "$row" predicted)"
done < <(grep '^ROW' "$tmp/out")
cat <<'NOTE'

train_s: training steps and transitions (evaluation excluded); speedup: static's train_s over
the row's; to_target_s: train_s until the test accuracy first reached the target (checked
after each epoch); predicted: the planner's overall speedup for the same configuration.
Note: 8 ranks share this machine's cores, so extra replicas add no compute here: AutoDP can
only remove pipeline bubbles and communication, not multiply throughput as it does with
one device per rank (the planner's prediction knows this: --compute-devices = the cores).
NOTE
