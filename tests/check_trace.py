#!/usr/bin/python3
"""Checks that a weft timeline is a Chrome trace that Perfetto's JSON importer accepts.

Usage: check_trace.py TRACE.json [NAME ...]: exits non-zero, saying why, if the file is
not a JSON array of trace events with the fields each phase type needs, or if a listed
name never occurs as an event's name or category ("communicate", "MPI_ALLREDUCE").
"""
import json
import sys


def main():
    path, phases = sys.argv[1], sys.argv[2:]
    with open(path) as f:
        events = json.load(f)
    if not isinstance(events, list) or not events:
        sys.exit("not a non-empty JSON array of events")
    seen = set()
    for i, e in enumerate(events):
        for key in ("name", "ph", "pid", "tid"):
            if key not in e:
                sys.exit(f"event {i} has no '{key}': {e}")
        if e["ph"] == "X":
            if not isinstance(e.get("ts"), int) or not isinstance(e.get("dur"), int) or e["dur"] < 0:
                sys.exit(f"complete event {i} needs integer ts and dur >= 0: {e}")
            # Times are on the monotonic clock: a span from 0 began before the trace did.
            if e["ts"] <= 0:
                sys.exit(f"complete event {i} starts at the clock's epoch: {e}")
        elif e["ph"] == "i":
            if not isinstance(e.get("ts"), int):
                sys.exit(f"instant event {i} needs an integer ts: {e}")
        elif e["ph"] != "M":
            sys.exit(f"event {i} has an unexpected phase type {e['ph']!r}")
        seen.add(e["name"])
        if "cat" in e:
            seen.add(e["cat"])
    missing = [p for p in phases if p not in seen]
    if missing:
        sys.exit(f"phases never recorded: {missing}; seen: {sorted(seen)}")
    print(f"{path}: {len(events)} events, phases {sorted(seen)}")


if __name__ == "__main__":
    main()
