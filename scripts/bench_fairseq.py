#!/usr/bin/env python
"""Training throughput against fairseq 0.12.2, side by side: one JSON line per measurement.

Interleaved rounds (fairseq, ours, fairseq, ours, ...) on the same machine, model sizes, data
(Multi30k EN-DE, 8k joint vocabulary) and batch budget (4,096 tokens), both on the same
threads. The same scope on both sides: the whole training loop (data, logging included) as
`fairseq-train` and `translate train` run it, with no checkpoint writes inside the timed
updates, and the first 10 updates left out on both sides (the anchor leaves out fairseq's first
log interval). fairseq comes from ../shared/anchors/fairseq (run.sh); where it is not built,
its measurements are skipped with a line saying so.

    .venv/bin/python scripts/bench_fairseq.py --model tiny --rounds 2
    .venv/bin/python scripts/bench_fairseq.py --model base --rounds 2 --updates 20
    .venv/bin/python scripts/bench_fairseq.py --precision fp32 auto   # ours both ways, each round

fairseq trains in fp32 (run.sh); ours in what train.precision picks (auto: bf16 on CPUs that
compute it natively, AMX or AVX512-BF16), or in each --precision given, one after the other.
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
from typing import Optional

import torch

from translate.core.choices import Precision
from translate.core import precision
from translate.core.precision import resolved

ROOT = Path(__file__).resolve().parents[1]
ANCHOR = ROOT.parent / "shared" / "anchors" / "fairseq"
SKIPPED = 10  # leading updates left out on both sides (start-up, allocator warm-up)

NOT_BUILT = "fairseq anchor not built: bash ../shared/anchors/fairseq/setup.sh"


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def anchor_built() -> bool:
    """Whether setup.sh has built fairseq (into $FAIRSEQ_ANCHOR, /tmp/fairseq-anchor by default)."""
    return (Path(os.environ.get("FAIRSEQ_ANCHOR", "/tmp/fairseq-anchor")) / "venv" / "bin" / "fairseq-train").exists()


def threads_env(threads: int) -> dict:
    """This process's environment with both trainers' thread pools at `threads`."""
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))


def fairseq(model: str, updates: int, threads: int) -> Optional[float]:
    """fairseq-train's steady target tokens/s (run.sh leaves out its first log interval)."""
    if not anchor_built():
        return None
    env = threads_env(threads)
    result = subprocess.run(["bash", str(ANCHOR / "run.sh"), model, str(updates)], capture_output=True, text=True,
                            env=env, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])["target_tokens_per_s"]


def machine() -> str:
    """The machine a figure names: the CPU's model name, family and model, the instructions torch
    dispatches to, whether it has native bf16, and its CPU count (translate.core.precision's)."""
    cpu = ", ".join(part for part in (precision.cpu_model(), precision.cpu_family_model()) if part)
    bf16 = "native bf16" if precision.native_bf16() else "no native bf16"
    return f"{cpu}, {precision.isa()}, {bf16}, {os.cpu_count()} CPUs"


def commit(tree: Path = ROOT, revision: str = "HEAD") -> str:
    """The short commit the figures were measured at: `revision` of the checkout `tree` ("unknown"
    outside a git checkout). The one lookup the scripts share."""
    found = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", revision], capture_output=True, text=True)
    return found.stdout.strip() or "unknown"


def timed_overrides(updates: int, threads: int, run_dir: Path) -> list:
    """`translate train`'s arguments for a timed run of any preset: `updates` updates logged every
    SKIPPED (so that steady_rate can leave out the first window), no checkpoints or validation."""
    return [f"train.max_steps={updates}", f"train.log_every={SKIPPED}", f"train.threads={threads}",
            "checkpoint.every_steps=0", "checkpoint.every_minutes=null", "valid.every_steps=0", f"run_dir={run_dir}"]


def train_overrides(model: str, updates: int, threads: int, run_dir: Path, precision: str = "auto") -> list:
    """`translate train`'s arguments for run.sh's settings: its model sizes and dropout, Multi30k
    and 4,096-token batches (config=tiny), warmup 4000, no checkpoints or validation."""
    return ["config=tiny", f"model={model}", "model.dropout=0.1", "optim.warmup_steps=4000",
            f"train.precision={precision}", *timed_overrides(updates, threads, run_dir)]


def ours(model: str, updates: int, threads: int, folder: Path, precision: str = "auto") -> float:
    """`translate train`'s target tokens/s over its log windows after the first SKIPPED updates
    (each window's wall time covers the whole loop: data, step, logging)."""
    run_dir = folder / f"ours-{model}"
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    command = [sys.executable, "-m", "translate", "train", *train_overrides(model, updates, threads, run_dir, precision)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return steady_rate(result.stderr)


def steady_rate(log: str) -> float:
    """Target tokens/s over a `translate train` log's windows after the first SKIPPED updates."""
    windows = [(int(n), float(rate)) for n, rate in re.findall(r"update (\d+): loss .*? (\d+) tgt tok/s", log)]
    rates = [rate for n, rate in windows if n > SKIPPED]
    if not rates:
        raise SystemExit(f"no log windows after update {SKIPPED} in:\n{log[-2000:]}")
    return len(rates) / sum(1 / rate for rate in rates)  # equal-sized windows: the harmonic mean is tokens / time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", choices=["tiny", "base"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--updates", type=int, default=60, help="updates per run, the first 10 left out")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", nargs="+", default=["auto"], choices=["auto", "fp32", "bf16"],
                        help="ours in each (train.precision), after fairseq in every round")
    args = parser.parse_args()
    picked = resolved(Precision.auto, torch.device("cpu")).value
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(1, args.rounds + 1):
            theirs = fairseq(args.model, args.updates, args.threads)
            if theirs is None:
                emit(measurement="fairseq_train", skipped=NOT_BUILT)
            for precision in args.precision:
                mine = ours(args.model, args.updates, args.threads, Path(folder), precision)
                emit(measurement="train_vs_fairseq", round=round_, model=args.model, updates=args.updates,
                     threads=args.threads, precision=picked if precision == "auto" else precision,
                     ours_target_tokens_per_s=round(mine, 1), fairseq_target_tokens_per_s=theirs,
                     ratio=round(mine / theirs, 3) if theirs else None)


if __name__ == "__main__":
    main()
