#!/usr/bin/env bash
# The distributed optimizers on the demo model (examples/train.cc), same run, 2 and 4
# ranks: steps/s of every optimizer against local SGD (no communication) and gradient
# allreduce, the communication time each leaves exposed per step, and how much of it the
# overlap hides; then the accuracy AWC and gradient allreduce reach on the demo task.
#
#   bench/optim_bench.sh [rank counts...]      (default: 2 4)
#
# Speed runs use a wide MLP (--hidden, default 1536: 2.4 M parameters) for --steps steps
# per epoch over --epochs epochs. Per optimizer:
#   steps/s   end to end (forward, backward, step), all epochs
#   step_ms   time inside step() per step (waiting for communication, combining, the
#             local update), averaged over ranks
#   exposed   = step_ms - step_ms(local SGD)          communication left exposed per step
#   isolated  = step_ms(--no-overlap) - step_ms(local) the same communication started in
#                                                      step(), with nothing to hide it
#   hidden    = 1 - exposed / isolated
#   vs GA     = exposed / exposed(gradient allreduce)
# ATC does its local updates in the gradient hooks, outside step(), so its step_ms lacks
# them. Run it on an otherwise idle machine: the numbers are differences of timings.
# Environment: OPTIM_BENCH_HIDDEN, OPTIM_BENCH_STEPS, OPTIM_BENCH_EPOCHS.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(2 4)
hidden=${OPTIM_BENCH_HIDDEN:-1536}
steps=${OPTIM_BENCH_STEPS:-10}
epochs=${OPTIM_BENCH_EPOCHS:-2}

"${BAZEL:-bazel}" build -c opt //examples:train >&2
binary=$("${BAZEL:-bazel}" info -c opt bazel-bin 2>/dev/null)/examples/train
tmp=$(mktemp -d /tmp/optim_bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cp "$binary" "$tmp/"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TMPDIR=/tmp
mpi_args="--mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"

run() {  # ranks, args... -> the RESULT line's fields
  local n=$1
  shift
  tools/weftrun -np "$n" --mpi-args "$mpi_args" "$tmp/train" --quiet --target 0 "$@" |
    grep '^RESULT' | sed 's/^RESULT //'
}
field() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }

configs=(
  "local|--optimizer local"
  "gradient_allreduce|--optimizer gradient_allreduce"
  "awc one-peer|--optimizer awc"
  "awc static exp2|--optimizer awc --static"
  "atc one-peer|--optimizer atc"
  "win_put one-peer|--optimizer win_put"
  "push_sum one-peer|--optimizer push_sum"
)

echo "### optim_bench: $(nproc) cores, model --hidden $hidden, $epochs epochs x $steps steps, batch 64"
for n in "${ranks[@]}"; do
  echo
  echo "ranks=$n"
  printf '%-20s %9s %9s %11s %11s %8s %8s\n' optimizer steps/s step_ms exposed_ms \
    isolated_ms hidden vs_GA
  local_ms=
  ga_exposed=
  for c in "${configs[@]}"; do
    label=${c%%|*}
    args=${c#*|}
    common=(--hidden "$hidden" --steps "$steps" --epochs "$epochs")
    # shellcheck disable=SC2086
    r=$(run "$n" $args "${common[@]}")
    sps=$(field "$r" steps_per_s)
    ms=$(field "$r" step_ms)
    if [ "$label" = local ]; then
      local_ms=$ms
      printf '%-20s %9s %9.2f %11s %11s %8s %8s\n' "$label" "$sps" "$ms" - - - -
      continue
    fi
    # shellcheck disable=SC2086
    r2=$(run "$n" $args "${common[@]}" --no-overlap)
    exposed=$(awk -v a="$ms" -v b="$local_ms" 'BEGIN { printf "%.2f", a - b }')
    isolated=$(awk -v a="$(field "$r2" step_ms)" -v b="$local_ms" 'BEGIN { printf "%.2f", a - b }')
    hidden_frac=$(awk -v e="$exposed" -v i="$isolated" \
      'BEGIN { if (i <= 0) print "n/a"; else printf "%.0f%%", 100 * (1 - e / i) }')
    [ "$label" = gradient_allreduce ] && ga_exposed=$exposed
    ratio=$(awk -v e="$exposed" -v g="$ga_exposed" \
      'BEGIN { if (g <= 0) print "n/a"; else printf "%.2fx", e / g }')
    printf '%-20s %9s %9.2f %11s %11s %8s %8s\n' "$label" "$sps" "$ms" "$exposed" \
      "$isolated" "$hidden_frac" "$ratio"
  done
done

echo
echo "### accuracy on the demo task (default model, 8 epochs), 4 ranks"
for o in awc gradient_allreduce; do
  r=$(run 4 --optimizer "$o")
  echo "$o: accuracy $(field "$r" accuracy), loss $(field "$r" loss), consensus $(field "$r" consensus)"
done
