#!/usr/bin/env python
"""Decoding and training speed on a quiet machine and beside another training, with OpenMP's
threads spinning a while before they sleep (libgomp's default) and sleeping at once
(OMP_WAIT_POLICY=PASSIVE): one JSON line per measurement.

A CPU shared with another job is common (a decode beside a training, two trainings on one
box). Each measurement is a whole process with the policy in its environment (OpenMP reads it
once, at start-up); the competitor is a `translate train config=tiny` with the same policy, so
each pair is what two of our processes do to each other. Rounds interleave the policies.

    make demo    # the decode measurements translate with runs/tiny-multi30k_en_de's model
    .venv/bin/python scripts/bench_contention.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_fairseq import steady_rate

ROOT = Path(__file__).resolve().parents[1]
# libgomp (torch's OpenMP on Linux) spins 300,000 times before it sleeps when OMP_WAIT_POLICY is
# unset, and not at all with PASSIVE; GOMP_SPINCOUNT sets the count whatever translate sets.
POLICIES = {"spin (OpenMP's default)": {"GOMP_SPINCOUNT": "300000"}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"}}

# One decode, timed inside the process (start-up left out): sentences/s of the test split.
DECODE = """
import sys, time, torch
from pathlib import Path
from translate.data.loading import load_corpus
from translate.translator import Translator
from translate.hydra_cli import load_config
torch.set_grad_enabled(False)
cfg = load_config("decode", ["config=tiny", "decode.length_penalty=0.6"])
sources = load_corpus(cfg.data, "test").pairs()[0][: int(sys.argv[2])]
translator = Translator.from_checkpoint(Path(sys.argv[1]))
translator.translate(sources[:32], cfg.decode)
started = time.perf_counter()
translator.translate(sources, cfg.decode)
print(len(sources) / (time.perf_counter() - started))
"""


def emit(**record) -> None:
    print(json.dumps(record), flush=True)


def environment(policy: dict, threads: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    return {**env, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT), **policy}


def train_command(run_dir: Path, updates: int, threads: int) -> list:
    return [sys.executable, "-m", "translate", "train", "config=tiny", f"run_dir={run_dir}", f"train.max_steps={updates}",
            "train.log_every=10", f"train.threads={threads}", "checkpoint.every_steps=0", "checkpoint.every_minutes=null",
            "valid.every_steps=0"]


def decode_rate(args, env: dict) -> float:
    result = subprocess.run([sys.executable, "-c", DECODE, args.checkpoint, str(args.sentences)], cwd=ROOT, env=env,
                            capture_output=True, text=True, check=True)
    return float(result.stdout.strip().splitlines()[-1])


def train_rate(args, env: dict, folder: Path) -> float:
    run_dir = folder / f"train-{time.monotonic_ns()}"
    result = subprocess.run(train_command(run_dir, args.updates, args.threads), cwd=ROOT, env=env, capture_output=True,
                            text=True, check=True)
    return steady_rate(result.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default=str(ROOT / "runs/tiny-multi30k_en_de/checkpoint_average.pt"))
    parser.add_argument("--sentences", type=int, default=400, help="test sentences decoded (beam 4)")
    parser.add_argument("--updates", type=int, default=40, help="training updates, the first 10 left out")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        for round_ in range(1, args.rounds + 1):
            for index, (name, policy) in enumerate(POLICIES.items()):
                env = environment(policy, args.threads)
                quiet = dict(decode=decode_rate(args, env), train=train_rate(args, env, folder))
                competitor = subprocess.Popen(train_command(folder / f"competitor-{round_}-{index}", 100000, args.threads),
                                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    time.sleep(20)  # past its start-up, into its updates
                    shared = dict(decode=decode_rate(args, env), train=train_rate(args, env, folder))
                finally:
                    competitor.terminate()
                    competitor.wait()
                for what, unit in (("decode", "sentences_per_s"), ("train", "target_tokens_per_s")):
                    emit(measurement=f"{what}_beside_a_training", round=round_, omp_wait_policy=name, threads=args.threads,
                         **{f"quiet_{unit}": round(quiet[what], 1), f"shared_{unit}": round(shared[what], 1)},
                         shared_over_quiet=round(shared[what] / quiet[what], 3))


if __name__ == "__main__":
    main()
