#!/usr/bin/env bash
# The distributed optimizers on the demo model (examples/train.cc), same run, 2 and 4
# ranks: the time per step end to end and inside step() of every optimizer against local
# SGD (no communication) and gradient allreduce, what communication costs each end to end,
# and how much of it the overlap hides; then the accuracy every optimizer reaches on the
# demo task, with its training time.
#
#   bench/optim_bench.sh [rank counts...]      (default: 2 4)
#
# Speed runs use a wide MLP (--hidden, default 1536: 2.4 M parameters) for --steps steps
# per epoch over --epochs epochs. Per optimizer:
#   e2e_ms    a training step's wall time end to end (forward, backward, step) in the
#             steady state: train's steady_step_ms (rank 0's clock; after the first 12
#             steps, the median over windows of 12 steps of their mean)
#   comm_ms   = e2e_ms - e2e_ms(local SGD)              what communication costs end to end
#   e2e_vs_GA = comm_ms / comm_ms(gradient allreduce)
#   step_ms   time inside step() per step (waiting for communication, combining, the
#             local update), averaged over ranks
#   exposed   = step_ms - step_ms(local SGD)            communication left exposed in step()
#   isolated  = step_ms(--no-overlap) - step_ms(local)  the same communication started in
#                                                       step(), with nothing to hide it
#   hidden    = 1 - exposed / isolated
#   vs_GA     = exposed / exposed(gradient allreduce)
#   e2e_range the lowest and highest e2e_ms over the runs
# Every figure is the median over OPTIM_BENCH_RUNS runs (default 3) of each optimizer, the
# optimizers taking turns run after run, so that a drift of the machine's speed lands on
# all of them alike; the differences above are taken between those medians. ATC does its
# local updates in the gradient hooks, outside step(), so its step_ms lacks them (its
# e2e_ms does not). Run it on an otherwise idle machine: the numbers are differences of
# timings. The accuracy table trains the default demo model (8 epochs) on 4 ranks with
# every optimizer, OPTIM_BENCH_RUNS runs each taking turns: the accuracy's range over the
# runs (each rank's model on the common test set, averaged over the ranks), the last run's
# loss and consensus distance, the median training time and its ratio to gradient
# allreduce's.
# Environment: OPTIM_BENCH_RUNS, OPTIM_BENCH_HIDDEN, OPTIM_BENCH_STEPS, OPTIM_BENCH_EPOCHS.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(2 4)
hidden=${OPTIM_BENCH_HIDDEN:-1536}
steps=${OPTIM_BENCH_STEPS:-60}
epochs=${OPTIM_BENCH_EPOCHS:-2}
runs=${OPTIM_BENCH_RUNS:-3}
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "OPTIM_BENCH_RUNS must be a positive count" >&2; exit 2; }
if (( steps * epochs < 48 )); then
  # steady_step_ms needs 12 start-up steps and 3 windows of 12; below, it is the mean.
  echo "optim_bench: $epochs x $steps steps are too few for the steady state (48);" \
    "e2e_ms is then the mean over all steps, start-up included" >&2
fi

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
ratio() { awk -v e="$1" -v g="$2" 'BEGIN { if (g <= 0) print "n/a"; else printf "%.2fx", e / g }'; }
# The median, and the lowest-highest range, of the numbers given as arguments.
median() {
  printf '%s\n' "$@" | sort -g |
    awk '{ v[NR] = $1 } END { printf "%.2f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# span [-d DIGITS] NUMBERS...: lowest-highest, with DIGITS decimals (default 1).
span() {
  local digits=1
  if [ "$1" = -d ]; then digits=$2; shift 2; fi
  printf '%s\n' "$@" | sort -g |
    awk -v d="$digits" 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.*f-%.*f", d, lo, d, hi }'
}

configs=(
  "local|--optimizer local"
  "gradient_allreduce|--optimizer gradient_allreduce"
  "awc one-peer|--optimizer awc"
  "awc static exp2|--optimizer awc --static"
  "atc one-peer|--optimizer atc"
  "win_put one-peer|--optimizer win_put"
  "push_sum one-peer|--optimizer push_sum"
)

echo "### optim_bench: $(nproc) cores, model --hidden $hidden, $epochs epochs x $steps steps, batch 64," \
  "medians of $runs runs"
for n in "${ranks[@]}"; do
  # label -> the runs' figures, space-separated
  declare -A e2e_runs=() ms_runs=() isolated_runs=()
  for (( k = 1; k <= runs; k++ )); do
    for c in "${configs[@]}"; do
      label=${c%%|*}
      args=${c#*|}
      common=(--hidden "$hidden" --steps "$steps" --epochs "$epochs")
      # shellcheck disable=SC2086
      r=$(run "$n" $args "${common[@]}")
      e2e_runs[$label]+=" $(field "$r" steady_step_ms)"
      ms_runs[$label]+=" $(field "$r" step_ms)"
      [ "$label" = local ] && continue
      # shellcheck disable=SC2086
      r2=$(run "$n" $args "${common[@]}" --no-overlap)
      isolated_runs[$label]+=" $(field "$r2" step_ms)"
    done
  done
  echo
  echo "ranks=$n"
  printf '%-20s %8s %11s %8s %9s %8s %10s %11s %8s %8s\n' optimizer e2e_ms e2e_range comm_ms \
    e2e_vs_GA step_ms exposed_ms isolated_ms hidden vs_GA
  local_ms=
  local_e2e=
  ga_exposed=
  ga_comm=
  for c in "${configs[@]}"; do
    label=${c%%|*}
    # shellcheck disable=SC2086
    e2e=$(median ${e2e_runs[$label]})
    # shellcheck disable=SC2086
    range=$(span ${e2e_runs[$label]})
    # shellcheck disable=SC2086
    ms=$(median ${ms_runs[$label]})
    if [ "$label" = local ]; then
      local_ms=$ms
      local_e2e=$e2e
      printf '%-20s %8s %11s %8s %9s %8.2f %10s %11s %8s %8s\n' "$label" "$e2e" "$range" - - \
        "$ms" - - - -
      continue
    fi
    comm=$(awk -v a="$e2e" -v b="$local_e2e" 'BEGIN { printf "%.2f", a - b }')
    exposed=$(awk -v a="$ms" -v b="$local_ms" 'BEGIN { printf "%.2f", a - b }')
    # shellcheck disable=SC2086
    isolated=$(awk -v a="$(median ${isolated_runs[$label]})" -v b="$local_ms" \
      'BEGIN { printf "%.2f", a - b }')
    hidden_frac=$(awk -v e="$exposed" -v i="$isolated" \
      'BEGIN { if (i <= 0) print "n/a"; else printf "%.0f%%", 100 * (1 - e / i) }')
    if [ "$label" = gradient_allreduce ]; then
      ga_exposed=$exposed
      ga_comm=$comm
    fi
    printf '%-20s %8s %11s %8s %9s %8.2f %10s %11s %8s %8s\n' "$label" "$e2e" "$range" "$comm" \
      "$(ratio "$comm" "$ga_comm")" "$ms" "$exposed" "$isolated" "$hidden_frac" \
      "$(ratio "$exposed" "$ga_exposed")"
  done
  unset e2e_runs ms_runs isolated_runs
done

echo
echo "### accuracy on the demo task (default model, 8 epochs), 4 ranks, $runs runs each"
declare -A acc_runs=() time_runs=() last=()
for (( k = 1; k <= runs; k++ )); do
  for c in "${configs[@]}"; do
    label=${c%%|*}
    # shellcheck disable=SC2086
    r=$(run 4 ${c#*|})
    acc_runs[$label]+=" $(field "$r" accuracy)"
    time_runs[$label]+=" $(field "$r" train_s)"
    last[$label]="$(field "$r" loss) $(field "$r" consensus) $(field "$r" steps)"
  done
done
printf '%-20s %15s %8s %11s %7s %9s %7s\n' optimizer accuracy loss consensus steps train_s vs_GA
# shellcheck disable=SC2086
ga_time=$(median ${time_runs[gradient_allreduce]})
for c in "${configs[@]}"; do
  label=${c%%|*}
  # shellcheck disable=SC2086
  t=$(median ${time_runs[$label]})
  # shellcheck disable=SC2086
  acc=$(span -d 4 ${acc_runs[$label]})
  read -r loss consensus nsteps <<<"${last[$label]}"
  printf '%-20s %15s %8s %11s %7s %9s %7s\n' "$label" "$acc" "$loss" "$consensus" "$nsteps" "$t" \
    "$(ratio "$t" "$ga_time")"
done
