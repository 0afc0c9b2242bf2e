"""binding_bench (Python side): the per-call time of weft.allreduce and
weft.neighbor_allreduce from Python, on NumPy arrays and torch tensors, with the protocol
of bench/binding_bench.cc (20 warm-up calls; 5 repetitions of K calls; a repetition's time
is the slowest rank's mean; the median of the 5 is reported). Run by
bench/run_binding_bench.sh, which prints the comparison table."""
import statistics
import time

import numpy as np
import torch

import weft

WARMUP = 20
REPETITIONS = 5


def calls_for(nbytes):
    return 20 if nbytes >= 16 << 20 else 200 if nbytes >= 1 << 20 else 2000


def median_micros(nbytes, op):
    for _ in range(WARMUP):
        op()
    calls = calls_for(nbytes)
    reps = []
    for _ in range(REPETITIONS):
        weft.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            op()
        us = (time.perf_counter() - start) / calls * 1e6
        reps.append(float(weft.allgather(np.array([us])).max()))
    return statistics.median(reps)


def main():
    weft.init()
    for op_name in ("allreduce", "neighbor_allreduce"):
        op = getattr(weft, op_name)
        for nbytes in (4, 4096, 1 << 20, 16 << 20):
            kinds = ["numpy", "torch"]
            if op_name == "allreduce":
                # In place: no output to allocate, so only the binding's own cost remains.
                kinds += ["numpy-inplace", "torch-inplace"]
            for kind in kinds:
                x = np.ones(nbytes // 4, dtype=np.float32)
                if kind.startswith("torch"):
                    x = torch.from_numpy(x)
                call = weft.allreduce_ if kind.endswith("inplace") else op
                us = median_micros(nbytes, lambda: call(x))
                if weft.rank() == 0:
                    print(f"BENCH lang=python input={kind} op={op_name} bytes={nbytes} "
                          f"us={us:.2f}", flush=True)
    weft.shutdown()


if __name__ == "__main__":
    main()
