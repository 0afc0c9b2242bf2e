#!/usr/bin/env bash
# The per-call cost of weft's bindings: weft.allreduce and neighbor_allreduce from C++,
# Python (NumPy, torch) and Go, at 4 B, 4 KiB, 1 MiB and 16 MiB, in one run on the same ranks.
#
#   bench/run_binding_bench.sh          # 2 ranks
#   bench/run_binding_bench.sh 4        # 4 ranks
#
# Everything is built with -c opt first. Prints one table; the raw "BENCH" lines too.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
np=${1:-2}
bazel=${BAZEL:-bazel}

targets=(//bench:binding_bench //bindings/python:weft)
have_go=0
if [ -f bindings/go/bench/run_bench.sh ]; then
  have_go=1
  targets+=(//capi:libweft.so)
fi
"$bazel" build -c opt "${targets[@]}"
bin=$("$bazel" info -c opt bazel-bin 2>/dev/null)

# Run from a copy: a concurrent build may replace bazel-bin's files.
tmp=$(mktemp -d /tmp/binding_bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cp "$bin/bench/binding_bench" "$tmp/"
cp -rL "$bin/bindings/python/weft" "$tmp/weft"
export WEFT_TEST_MPI_TIMEOUT=${BINDING_BENCH_TIMEOUT:-900}
# Python's out-of-place calls take outputs of 64 KiB and more from weft's cache of freed
# outputs (weft_tensor_empty_like); smaller ones come from malloc, as do the C++ and Go
# buffers (allocated once per size). BINDING_BENCH_PIN_MALLOC=1 pins glibc's thresholds so
# that freed blocks stay in the heap instead (fresh pages from the system cost a page fault
# each, in whichever process touches them first, peer ranks included).
if [ "${BINDING_BENCH_PIN_MALLOC:-0}" = 1 ]; then
  export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=134217728
fi

results="$tmp/results.txt"
echo "### binding_bench on $np ranks ($(nproc) cores on this machine; malloc thresholds" \
  "${MALLOC_MMAP_THRESHOLD_:+pinned}${MALLOC_MMAP_THRESHOLD_:-glibc defaults})"
tests/mpirun_test.sh "$np" "$tmp/binding_bench" | tee -a "$results"
PYTHONPATH="$tmp" tests/mpirun_test.sh "$np" /usr/bin/python3 bench/binding_bench.py | tee -a "$results"
if [ "$have_go" = 1 ]; then
  bindings/go/bench/run_bench.sh "$np" "$bin/capi" | tee -a "$results"
fi

/usr/bin/python3 - "$results" <<'PY'
import collections, sys
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    if not line.startswith("BENCH "):
        continue
    f = dict(kv.split("=", 1) for kv in line.split()[1:])
    rows.setdefault((f["op"], int(f["bytes"])), {})[f"{f['lang']}/{f['input']}"] = float(f["us"])
cols = []
for r in rows.values():
    for c in r:
        if c not in cols:
            cols.append(c)
base = next(c for c in cols if c.startswith("c++"))
others = [c for c in cols if c != base]
head = f"| op | bytes | {base} us | " + " | ".join(f"{c} us (+overhead)" for c in others) + " |"
print(head)
print("|" + "---|" * (3 + len(others)))
for (op, nbytes), r in rows.items():
    cells = [f"{r[c]:.2f} ({r[c] - r[base]:+.2f})" if c in r else "-" for c in others]
    print(f"| {op} | {nbytes} | {r[base]:.2f} | " + " | ".join(cells) + " |")
PY
