#!/usr/bin/env python3
"""Summarizes comm_bench runs: one row per rank count and op, over every run given.

    bench/summarize.py run1.log [run2.log ...]    # or the output on stdin

Reads the `RESULT {...}` lines comm_bench prints (bench/run.sh prints this summary after
its runs). A size seen again for the same op and rank count starts another run of it, so
the files may hold one run each or several. Per row:
  - added: weft's time minus raw MPI's at 4 KiB and below, in us: the median over those
    sizes, and the worst size, each as its range over the runs;
  - the ratio (raw MPI time / weft time, > 1: weft faster) from 8 KiB to 512 KiB, and from
    1 MiB, as the range over sizes and runs, with the size of the lowest;
  - for the fused case, weft's burst against one MPI_Allreduce of all its bytes (the ideal),
    without and with a group: the range over the runs.
Every figure compares weft with the baseline measured in the same run.
"""
import collections
import json
import statistics
import sys

SMALL = 4096
LARGE = 1 << 20


def read_results(lines):
    """The RESULT records, each with its run: how often its (ranks, op, bytes) came before."""
    seen = collections.Counter()
    results = []
    for line in lines:
        if not line.startswith("RESULT "):
            continue
        record = json.loads(line[len("RESULT "):])
        key = (record["ranks"], record["op"], record["bytes"])
        record["run"] = seen[key]
        seen[key] += 1
        results.append(record)
    return results


def size_name(n):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def span(values, digits):
    low, high = min(values), max(values)
    if f"{low:.{digits}f}" == f"{high:.{digits}f}":
        return f"{low:.{digits}f}"
    return f"{low:.{digits}f} to {high:.{digits}f}"


def ratios(records, keep):
    """'low to high (lowest at SIZE)' over the records whose size `keep` accepts."""
    chosen = [r for r in records if keep(r["bytes"])]
    if not chosen:
        return "-"
    lowest = min(chosen, key=lambda r: r["ratio"])
    return f"{span([r['ratio'] for r in chosen], 2)} (lowest at {size_name(lowest['bytes'])})"


def summarize(results):
    rows = collections.defaultdict(list)
    for r in results:
        rows[(r["ranks"], r["op"])].append(r)
    out = ["| ranks | op | runs | added at <= 4 KiB, us: median size | worst size "
           "| ratio 8 KiB-512 KiB | ratio >= 1 MiB |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    fused = []
    for (ranks, op), records in sorted(rows.items()):
        runs = sorted({r["run"] for r in records})
        if "mpi_one_buffer_us" in records[0] and records[0]["mpi_one_buffer_us"] > 0:
            fused.append((ranks, op, records, len(runs)))
            continue
        medians, worst = [], []
        for run in runs:
            added = [r["weft_us"] - r["mpi_us"] for r in records
                     if r["run"] == run and r["bytes"] <= SMALL]
            if added:
                medians.append(statistics.median(added))
                worst.append(max(added))
        out.append(f"| {ranks} | {op} | {len(runs)} | "
                   f"{span(medians, 1) if medians else '-'} | {span(worst, 1) if worst else '-'} | "
                   f"{ratios(records, lambda b: SMALL < b < LARGE)} | "
                   f"{ratios(records, lambda b: b >= LARGE)} |")
    for ranks, op, records, runs in fused:
        alone = [r["weft_us"] / r["mpi_one_buffer_us"] for r in records]
        grouped = [r["weft_grouped_us"] / r["mpi_one_buffer_us"] for r in records
                   if r.get("weft_grouped_us", -1) > 0]
        out.append("")
        out.append(f"{op} on {ranks} ranks ({runs} runs): weft's burst took "
                   f"{span(alone, 2)}x one MPI_Allreduce of all its bytes"
                   + (f", {span(grouped, 2)}x in a group" if grouped else ""))
    return "\n".join(out)


def main(paths):
    lines = []
    if paths:
        for path in paths:
            with open(path) as f:
                lines.extend(f)
    else:
        lines = sys.stdin.readlines()
    results = read_results(lines)
    if not results:
        print("summarize.py: no RESULT lines", file=sys.stderr)
        return 1
    print(summarize(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
