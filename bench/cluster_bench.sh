#!/usr/bin/env bash
# comm_bench across hosts of a simulated cluster (tools/cluster), one rank per host (or
# --ranks-per-host N), with every host's link shaped: weft against raw MPI in the same run,
# and the fraction of the link rate each reaches. Needs root (network namespaces).
#
#   bench/cluster_bench.sh                          # 4 and 8 hosts, 1gbit and 10gbit links
#   bench/cluster_bench.sh --hosts "4" --links "1gbit" --mpi-args "--mca ..."
#   bench/cluster_bench.sh --ranks-per-host 2 --ops hierarchical_neighbor_allreduce
#
# --mpi-args goes to weftrun (e.g. Open MPI's collective algorithm choice); --ops, --min-bytes,
# --max-bytes and --target-seconds (how long each size is timed, default 2: at least 5
# calls, so that the skew of the barrier before the loop weighs little) to comm_bench. The fraction is busbw over the link rate in one direction:
# for allreduce busbw = algbw * 2(n-1)/n; for the neighbor ops, algbw * in-degree, which is
# what each host sends on its link per second.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

hosts_list="4 8"
links="1gbit 10gbit"
mpi_args=""
ops=allreduce,neighbor_allreduce,neighbor_allreduce_onepeer
min_bytes=1048576
max_bytes=16777216
per_host=1
target_seconds=2
while (($# > 0)); do
  case $1 in
    --hosts) hosts_list=$2; shift ;;
    --links) links=$2; shift ;;
    --mpi-args) mpi_args=$2; shift ;;
    --ops) ops=$2; shift ;;
    --min-bytes) min_bytes=$2; shift ;;
    --max-bytes) max_bytes=$2; shift ;;
    --ranks-per-host) per_host=$2; shift ;;
    --target-seconds) target_seconds=$2; shift ;;
    *) echo "usage: $0 [--hosts \"4 8\"] [--links \"1gbit 10gbit\"] [--mpi-args ARGS] [--ops LIST] [--min-bytes N] [--max-bytes N] [--ranks-per-host N] [--target-seconds S]" >&2; exit 2 ;;
  esac
  shift
done

# shellcheck source=bench/cluster_lib.sh
source bench/cluster_lib.sh
cluster_bench_prepare //bench:comm_bench bench/comm_bench
version=$(git describe --always --dirty 2>/dev/null || echo unknown)

echo "# cluster_bench: weft $version, $(nproc) cores shared by every host, tools/cluster links" \
  "shaped with tc tbf, no added delay; mpi-args: ${mpi_args:-none}"
printf '# %-5s %-7s %-27s %9s | %10s %7s %6s | %10s %7s %6s\n' hosts link op bytes \
  "weft(us)" "busbw" "link" "mpi(us)" "busbw" "link"
for n in $hosts_list; do
  for link in $links; do
    dir=$(tools/cluster up --hosts "$n" --link "$link")
    spec=$(seq -s, -f "h%g:$per_host" 1 "$n")
    rate_gbps=$(awk -v l="$link" 'BEGIN { sub(/gbit/, "", l); print l / 8 }') # GB/s
    TMPDIR=/tmp tools/cluster exec "$dir" h1 -- tools/weftrun -H "$spec" \
      ${mpi_args:+--mpi-args "$mpi_args"} "$work/comm_bench" --ops "$ops" \
      --min-bytes "$min_bytes" --max-bytes "$max_bytes" --target-seconds "$target_seconds" \
      --weft-version "git $version" \
      >"$work/out" 2>&1 || { cat "$work/out"; exit 1; }
    python3 - "$work/out" "$n" "$link" "$rate_gbps" <<'EOF'
import json, sys
path, n, link, rate = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
for line in open(path):
    if not line.startswith("RESULT "):
        continue
    r = json.loads(line[7:])
    print(f"  {n:<5} {link:<7} {r['op']:<27} {r['bytes']:9d} | {r['weft_us']:10.0f} "
          f"{r['weft_busbw_gbps']:7.3f} {r['weft_busbw_gbps'] / rate:6.2f} | {r['mpi_us']:10.0f} "
          f"{r['mpi_busbw_gbps']:7.3f} {r['mpi_busbw_gbps'] / rate:6.2f}")
EOF
    tools/cluster down "$dir"
    dir=""
  done
done
