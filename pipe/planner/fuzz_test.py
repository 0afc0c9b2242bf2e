#!/usr/bin/python3
"""Fuzzes weft-plan's flags and layer files: random command lines built from its flags with
values that break parsers and cost models (negative, zero, huge, tiny, NaN, infinity, hex,
garbage, empty), and random CSV and JSON layer files (bad headers, missing and extra fields,
huge and non-finite numbers, long names, duplicates, truncation). Every run must end by
itself within the time bound, exit 0 (a plan), 1 or 2 (an error on stderr), never by a
signal; a plan must print no NaN or infinity.

    fuzz_test.py WEFT_PLAN [CASES] [SEED]
"""
import os
import random
import re
import subprocess
import sys
import tempfile
import time

TIME_BOUND_S = 20  # per run; the slowest valid plans here take well under a second

NUMBERS = ["0", "1", "2", "3", "8", "16", "-1", "-8", "1e9", "1e308", "1e-308", "1e-320",
           "nan", "inf", "-inf", "0x10", "1.5", "9999999999999999999", "2147483648", "",
           "abc", "1e", "--", "0.3333", "65536", "16384"]
INT_FLAGS = ["--machines", "--devices", "--k0", "--epochs", "--micro-batches", "--batch",
             "--epoch-samples", "--tokens", "--hidden"]
REAL_FLAGS = ["--alpha", "--lambda", "--flops", "--bandwidth", "--inter-bandwidth",
              "--cache-bandwidth", "--optimizer-bytes", "--compute-devices"]
CHOICE_FLAGS = {"--strategy": ["optimal", "greedy", "even", "best", ""],
                "--schedule": ["gpipe", "1f1b", "zigzag", ""],
                "--model": ["vit-b16", "vit-l16", "bert-base", "bert-large", "gpt2",
                            "gpt2-medium", "gpt2-large", "gpt2-xl", "nope", ""]}
SWITCHES = ["--cache", "--no-autopipe", "--no-autodp", "--ablation", "--compare",
            "--global-batch", "--list-models", "--unknown-flag", "-x"]


def layer_file(rng, directory, k):
    """A layer file, sometimes valid, sometimes broken in one or several ways."""
    n = rng.choice([0, 1, 2, 5, 24, 300])
    rows = []
    for i in range(n):
        name = rng.choice([f"layer{i}", "", "a,b", "x" * rng.choice([1, 5000]), "dup"])
        params = rng.choice(["1000", "0", "-5", "1e308", "nan", "inf", "12.5", "", "x",
                             str(rng.randint(1, 10 ** 7))])
        t = rng.choice([None, "0.001", "0", "-1", "1e-320", "nan", "inf", "1e308", ""])
        rows.append((name, params, t))
    if rng.random() < 0.5:
        path = os.path.join(directory, f"layers{k}.csv")
        header = rng.choice(["name,params", "name,params,time", "params,name", "", "name"])
        lines = [header] + [",".join(v for v in r if v is not None) for r in rows]
        text = "\n".join(lines)
    else:
        path = os.path.join(directory, f"layers{k}.json")
        items = []
        for name, params, t in rows:
            fields = [f'"name": "{name}"', f'"params": {params or "null"}']
            if t is not None:
                fields.append(f'"time": {t or "null"}')
            if rng.random() < 0.1:
                fields.append('"extra": 1')
            items.append("{" + ", ".join(fields) + "}")
        text = "[" + ", ".join(items) + "]"
    if rng.random() < 0.15:
        text = text[:rng.randint(0, len(text))]  # truncated
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def command(rng, directory, k):
    args = []
    if rng.random() < 0.7:
        args += ["--model", rng.choice(CHOICE_FLAGS["--model"])]
    else:
        args += ["--layers", layer_file(rng, directory, k)]
    for _ in range(rng.randint(0, 6)):
        kind = rng.random()
        if kind < 0.35:
            args += [rng.choice(INT_FLAGS), rng.choice(NUMBERS)]
        elif kind < 0.65:
            args += [rng.choice(REAL_FLAGS), rng.choice(NUMBERS)]
        elif kind < 0.8:
            flag = rng.choice(["--strategy", "--schedule"])
            args += [flag, rng.choice(CHOICE_FLAGS[flag])]
        elif kind < 0.95:
            args.append(rng.choice(SWITCHES))
        else:
            args.append(rng.choice(INT_FLAGS + REAL_FLAGS))  # a flag without its value
    return args


def main():
    binary = sys.argv[1]
    cases = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 20261201
    rng = random.Random(seed)
    failures, exits, slowest = [], {}, 0.0
    directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    non_finite = re.compile(r"(?<![A-Za-z])(nan|-?inf)(?![A-Za-z])", re.IGNORECASE)
    for k in range(cases):
        args = command(rng, directory, k)
        start = time.monotonic()
        try:
            run = subprocess.run([binary] + args, capture_output=True, text=True,
                                 errors="replace", timeout=TIME_BOUND_S)
        except subprocess.TimeoutExpired:
            failures.append(f"ran past {TIME_BOUND_S} s: {args}")
            continue
        took = time.monotonic() - start
        slowest = max(slowest, took)
        exits[run.returncode] = exits.get(run.returncode, 0) + 1
        if run.returncode not in (0, 1, 2):
            failures.append(f"exit status {run.returncode}: {args}\n{run.stderr[-400:]}")
        elif run.returncode == 0 and non_finite.search(run.stdout):
            line = next(l for l in run.stdout.splitlines() if non_finite.search(l))
            failures.append(f"a plan with a non-finite number ({line[:160]!r}): {args}")
        elif run.returncode != 0 and not run.stderr.strip():
            failures.append(f"exit status {run.returncode} without a message: {args}")
    print(f"{cases} command lines (seed {seed}): exit statuses {dict(sorted(exits.items()))}, "
          f"slowest run {slowest:.2f} s")
    for f in failures[:20]:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
