#!/usr/bin/env python
"""How much a fresh process's fp32 matrix-product peak (flops.matmul_peak) moves on this
machine: one JSON line per measurement. Each measurement runs in a Python process of its own.

  - variants: the peak as training measures it ("current": 16 windows of one thread's 512 x 512
    products, 1.25 s), the same with a preallocated output ("out"), other sizes ("size1024",
    "size256") and a longer measurement ("long": 3 s), `--repeats` fresh processes each;
  - cores: one thread pinned to core 0, then 1, then 0, then 1, in one process (`--repeats` of them).
Then one line per variant with the spread (largest over smallest). Force both sides down to see a
CPU without AVX-512: ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2.

    .venv/bin/python scripts/probe_matmul_peak.py --repeats 6
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict

VARIANTS = ["current", "out", "size1024", "size256", "long"]


def peak(variant: str) -> float:
    """FLOP/s of one variant's measurement, in this process (two threads' worth)."""
    import torch

    from translate.training import flops

    torch.set_num_threads(2)
    cpu = torch.device("cpu")
    if variant == "current":
        return flops.matmul_peak(cpu, torch.float32, seconds=1.25)
    if variant.startswith("size"):
        return flops.matmul_peak(cpu, torch.float32, seconds=1.25, size=int(variant[4:]))
    if variant == "long":
        return flops.matmul_peak(cpu, torch.float32, seconds=3.0, windows=16)
    # "out": matmul_peak's windows, written out with a preallocated output (no allocation per product).
    n, generator = 512, torch.Generator().manual_seed(0)
    a, b, c = torch.randn(n, n, generator=generator), torch.randn(n, n, generator=generator), torch.empty(n, n)
    torch.set_num_threads(1)

    def window(seconds: float):
        count, start = 0, time.perf_counter()
        while count < 2 or time.perf_counter() - start < seconds:
            torch.mm(a, b, out=c)
            count += 1
        return count, time.perf_counter() - start

    seconds = 1.25 / 17
    window(seconds)  # warm-up
    best = max(2 * n**3 * count / took for count, took in (window(seconds) for _ in range(16)))
    return 2 * best


def pinned() -> dict:
    """One thread's peak pinned to each core in turn (0, 1, 0, 1), in this process."""
    import torch

    from translate.training import flops

    torch.set_num_threads(1)
    found = defaultdict(list)
    for core in (0, 1, 0, 1):
        os.sched_setaffinity(0, {core})
        found[core].append(round(flops.matmul_peak(torch.device("cpu"), torch.float32, seconds=1.25) / 1e12, 4))
    return dict(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: one measurement
    args = parser.parse_args()
    if args.one:
        result = pinned() if args.one == "cores" else round(peak(args.one) / 1e12, 4)
        print(json.dumps(result))
        return
    child = lambda what: json.loads(subprocess.run([sys.executable, __file__, "--one", what], check=True,  # noqa: E731
                                                   capture_output=True, text=True).stdout.splitlines()[-1])
    spread = defaultdict(list)
    for repeat in range(1, args.repeats + 1):
        for variant in VARIANTS:
            tflops = child(variant)
            spread[variant].append(tflops)
            print(json.dumps({"measurement": "matmul_peak_fresh_process", "variant": variant, "repeat": repeat,
                              "tflops": tflops}), flush=True)
    for variant, values in spread.items():
        print(json.dumps({"measurement": "matmul_peak_spread", "variant": variant, "tflops": values,
                          "max_over_min": round(max(values) / min(values), 3)}), flush=True)
    for repeat in range(1, args.repeats + 1):
        print(json.dumps({"measurement": "matmul_peak_pinned", "repeat": repeat, "tflops_by_core": child("cores")}),
              flush=True)


if __name__ == "__main__":
    main()
