#!/usr/bin/env bash
# Training across hosts of a simulated cluster (tools/cluster) whose links are shaped: the
# demo's MLP (examples/train.cc) made wide enough that communication matters, trained by
# gradient allreduce, adapt-with-combine and adapt-then-combine over the dynamic one-peer
# graph, and local SGD (no communication, the compute-only baseline), one rank per host.
# Needs root (network namespaces).
#
#   bench/cluster_train_bench.sh                     # 4 hosts, 1gbit
#   bench/cluster_train_bench.sh --hosts "4 8" --link 1gbit --hidden 3200 --epochs 4
#
# Per optimizer: seconds per step end to end; communication per step = that minus local
# SGD's (what communication costs the step, after overlap); seconds per epoch; training
# seconds until the test accuracy first reaches --target (checked every --eval-every
# steps; evaluation time left out); the final accuracy (on 512 test samples); and each
# ratio to gradient allreduce. Accuracy is measured two ways: the mean over ranks of each
# rank's own model ("local"), and the model whose parameters are the average of all ranks'
# ("averaged": what a decentralized run deploys after one final allreduce; for gradient
# allreduce the two are the same model). Local SGD's averaged model means nothing.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

hosts_list=4
link=1gbit
hidden=3200   # 32 -> 3200 -> 3200 -> 10: 10.4 M parameters
batch=16
samples=512   # per rank: 32 steps per epoch at batch 16
epochs=4
target=0.93
eval_every=4
while (($# > 0)); do
  case $1 in
    --hosts) hosts_list=$2; shift ;;
    --link) link=$2; shift ;;
    --hidden) hidden=$2; shift ;;
    --batch) batch=$2; shift ;;
    --samples) samples=$2; shift ;;
    --epochs) epochs=$2; shift ;;
    --target) target=$2; shift ;;
    --eval-every) eval_every=$2; shift ;;
    *) echo "usage: $0 [--hosts \"4 8\"] [--link RATE] [--hidden N] [--batch N] [--samples N] [--epochs N] [--target X] [--eval-every STEPS]" >&2; exit 2 ;;
  esac
  shift
done

# shellcheck source=bench/cluster_lib.sh
source bench/cluster_lib.sh
cluster_bench_prepare //examples:train examples/train

configs=(
  "local|--optimizer local"
  "gradient_allreduce|--optimizer gradient_allreduce"
  "awc one-peer|--optimizer awc"
  "atc one-peer|--optimizer atc"
)
echo "# cluster_train_bench: weft $(git describe --always --dirty 2>/dev/null), $(nproc) cores" \
  "shared by every host, links $link (tc tbf, no added delay); MLP --hidden $hidden," \
  "batch $batch per rank, $samples samples per rank, $epochs epochs, target accuracy $target" \
  "(checked every $eval_every steps)"
for n in $hosts_list; do
  dir=$(tools/cluster up --hosts "$n" --link "$link")
  spec=$(seq -s, -f 'h%g' 1 "$n")
  for c in "${configs[@]}"; do
    label=${c%%|*}
    # shellcheck disable=SC2086
    TMPDIR=/tmp tools/cluster exec "$dir" h1 -- tools/weftrun -H "$spec" "$work/train" \
      ${c#*|} --quiet --target 0 --hidden "$hidden" --batch "$batch" --samples "$samples" \
      --epochs "$epochs" --test-samples 512 --eval-every "$eval_every" --eval-average >"$work/$n.${label// /_}" 2>&1 || { cat "$work/$n.${label// /_}"; exit 1; }
  done
  tools/cluster down "$dir"
  dir=""
  python3 - "$work" "$n" "$target" "$samples" "$batch" "${configs[@]}" <<'PY'
import sys
work, n, target, samples, batch = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
labels = [c.split("|")[0] for c in sys.argv[6:]]
steps_per_epoch = samples // batch
rows = {}
for label in labels:
    lines = {"EPOCH": [], "EVAL": [], "RESULT": []}
    for line in open(f"{work}/{n}.{label.replace(' ', '_')}"):
        kind = line.split(" ", 1)[0]
        if kind in lines:
            lines[kind].append(dict(f.split("=", 1) for f in line.split()[1:]))
    epochs, result = lines["EPOCH"], lines["RESULT"][0]
    total = float(epochs[-1]["train_s"])
    def reach(key):
        return next((float(e["train_s"]) for e in lines["EVAL"] if float(e[key]) >= target), None)
    rows[label] = dict(step=total / (steps_per_epoch * len(epochs)), epoch=total / len(epochs),
                       reach=reach("accuracy"), reach_avg=reach("average_accuracy"),
                       acc=float(result["accuracy"]), acc_avg=float(result["average_accuracy"]),
                       params=result["parameters"])
local = rows["local"]["step"]
ga = rows["gradient_allreduce"]
ga_comm = ga["step"] - local
print(f"\n{n} hosts, {rows['local']['params']} parameters; time to target and accuracy: "
      "local models / averaged model")
print(f"{'optimizer':<20} {'s/step':>7} {'comm s/step':>11} {'s/epoch':>8} {'s to target':>13} "
      f"{'accuracy':>15} | {'comm vs GA':>10} {'to target vs GA':>15}")
def fmt(x, spec):
    return "-" if x is None else format(x, spec)
def ratio(a, b):
    return "-" if a is None or b is None else f"{a / b:.2f}"
for label in labels:
    r = rows[label]
    comm = r["step"] - local
    is_local = label == "local"
    reach = f"{fmt(r['reach'], '.1f')}/{'-' if is_local else fmt(r['reach_avg'], '.1f')}"
    acc = f"{100 * r['acc']:.2f}/{'-' if is_local else format(100 * r['acc_avg'], '.2f')}%"
    comm_ratio = "" if is_local else (f"{comm / ga_comm:.2f}" if ga_comm > 0 else "n/a")
    reach_ratio = ("" if is_local else
                   f"{ratio(r['reach'], ga['reach'])}/{ratio(r['reach_avg'], ga['reach_avg'])}")
    print(f"{label:<20} {r['step']:7.3f} {comm:11.3f} {r['epoch']:8.1f} {reach:>13} "
          f"{acc:>15} | {comm_ratio:>10} {reach_ratio:>15}")
PY
done
