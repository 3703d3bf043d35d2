#!/usr/bin/env python
"""The label-smoothed loss on the CPU in bf16, computed in cache-sized chunks (as training does)
against the whole-tensor form: one JSON line per measurement, the two interleaved.

`--what loss`: the loss and its gradient alone, forward and backward, on random bf16 logits of
4,092 target tokens at each vocabulary size (8k: Multi30k's; 37k: WMT14 EN-DE's), the best of
`--repeats`. `--what loop`: `translate train config=multi30k` (bf16 where the CPU computes it
natively) for `--updates` updates, its steady target tokens/s as bench_fairseq.py measures ours
(the first 10 updates left out), rounds alternating the two forms.

    .venv/bin/python scripts/bench_loss.py --what loss
    .venv/bin/python scripts/bench_loss.py --what loop --rounds 3 --updates 60
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench_fairseq import ROOT, emit, steady_rate, threads_env, timed_overrides

FORMS = {"chunked": None, "whole": 0}  # CHUNK_BYTES: the module's own, or chunking off

# `translate train` with translate.training.loss.CHUNK_BYTES set first (sys.argv[1]).
TRAIN = """
import sys
import translate.training.loss as loss
if sys.argv[1] != "None":
    loss.CHUNK_BYTES = int(sys.argv[1])
sys.argv = sys.argv[:1] + sys.argv[2:]
from translate.cli import main
main()
"""


def time_loss(vocab: int, repeats: int) -> dict:
    from translate.core.host_memory import keep_freed_memory
    from translate.training import loss

    keep_freed_memory()  # as training does: freed blocks stay in the heap
    default = loss.CHUNK_BYTES
    torch.manual_seed(0)
    logits = (torch.randn(4092, vocab) * 3).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, vocab, (4092,))
    best = {form: float("inf") for form in FORMS}
    for _ in range(repeats):
        for form, chunk in FORMS.items():
            loss.CHUNK_BYTES = default if chunk is None else chunk
            logits.grad = None
            start = time.perf_counter()
            value, _ = loss.label_smoothed_nll(logits, target, 0.1)
            value.backward()
            best[form] = min(best[form], time.perf_counter() - start)
    loss.CHUNK_BYTES = default
    return best


def time_loop(form: str, updates: int, threads: int, folder: Path) -> float:
    run_dir = folder / form
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    command = [sys.executable, "-c", TRAIN, str(FORMS[form]), "train", "config=multi30k", "train.max_minutes=null",
               *timed_overrides(updates, threads, run_dir)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True, env=threads_env(threads))
    return steady_rate(result.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--what", choices=["loss", "loop"], default="loss")
    parser.add_argument("--repeats", type=int, default=7, help="--what loss: timings of each form, the best kept")
    parser.add_argument("--rounds", type=int, default=2, help="--what loop: runs of each form, alternating")
    parser.add_argument("--updates", type=int, default=60, help="--what loop: updates a run")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.what == "loss":
        for vocab in (8000, 37000):
            best = time_loss(vocab, args.repeats)
            emit(measurement="loss_forward_backward", vocab=vocab, target_tokens=4092, threads=args.threads,
                 **{f"{form}_ms": round(1e3 * seconds, 1) for form, seconds in best.items()},
                 ratio=round(best["whole"] / best["chunked"], 3))
        return
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(1, args.rounds + 1):
            rates = {form: time_loop(form, args.updates, args.threads, Path(folder)) for form in ("whole", "chunked")}
            emit(measurement="train_loop", config="multi30k", round=round_, updates=args.updates, threads=args.threads,
                 **{f"{form}_target_tokens_per_s": round(rate, 1) for form, rate in rates.items()},
                 ratio=round(rates["chunked"] / rates["whole"], 3))


if __name__ == "__main__":
    main()
