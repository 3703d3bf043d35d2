#!/usr/bin/env python
"""MFU of one training command run several times on one machine: is it steady? One JSON line
per logged window of each run (its peak, how many start-ups that peak is the best of,
throughput, MFU), then one line with the spread of MFU and of the peak across runs.

Every run starts from the same empty peak record (its own $XDG_CACHE_HOME), so the first run's
peak is its own measurement and each later one the best of the runs so far (flops.machine_peak).

    .venv/bin/python scripts/bench_mfu.py --runs 5
    .venv/bin/python scripts/bench_mfu.py --runs 5 --avx2     # a CPU without AVX-512 or bf16, forced
    .venv/bin/python scripts/bench_mfu.py --runs 2 --precision auto --steps 120
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Both sides of every product forced down to AVX2 (torch's kernels, oneDNN, MKL).
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
WINDOW = re.compile(r"update (\d+): .* ([0-9.]+) tgt tok/s .* mfu (\d+)% of ([0-9.]+) TFLOP/s (\w+) peak"
                    r"(?: \(best of (\d+) start-ups\))?")


def emit(**record) -> None:
    print(json.dumps(record), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--avx2", action="store_true", help="force torch, oneDNN and MKL down to AVX2")
    args = parser.parse_args()
    env = dict(os.environ, **(AVX2 if args.avx2 else {}))
    mfus, peaks = [], []
    with tempfile.TemporaryDirectory() as scratch:
        env["XDG_CACHE_HOME"] = str(Path(scratch) / "cache")  # an empty peak record, shared by the runs
        for run in range(1, args.runs + 1):
            run_dir = Path(scratch) / f"run{run}"
            command = [sys.executable, "-m", "translate", "train", f"config={args.config}",
                       f"train.precision={args.precision}", f"train.max_steps={args.steps}", f"train.log_every={min(20, args.steps)}",
                       "valid.every_steps=0", "checkpoint.every_steps=0", f"run_dir={run_dir}"]
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"run {run} failed: {done.stderr.strip().splitlines()[-1]}")
            for match in WINDOW.finditer(done.stdout + done.stderr):
                update, rate, mfu, peak, dtype, best_of = match.groups()
                emit(measurement="mfu_window", run=run, update=int(update), target_tokens_per_s=float(rate),
                     mfu=int(mfu) / 100, peak_tflops=float(peak), peak_dtype=dtype, peak_best_of=int(best_of or 1),
                     avx2_forced=args.avx2)
                mfus.append((run, int(update), int(mfu) / 100))
                peaks.append(float(peak))
    if not mfus:
        sys.exit("no MFU line in the runs' logs")
    last = max(update for _, update, _ in mfus)
    at_last = [mfu for _, update, mfu in mfus if update == last]
    emit(measurement="mfu_spread", runs=args.runs, update=last, mfu=at_last,
         mfu_max_over_min=round(max(at_last) / min(at_last), 3), peak_max_over_min=round(max(peaks) / min(peaks), 3),
         avx2_forced=args.avx2, precision=args.precision)


if __name__ == "__main__":
    main()
