#!/usr/bin/env python
"""GPU training throughput of base and big (bf16, 25k-token batches of synthetic tokens):
one JSON line per measurement. Needs only torch: it drives translate.model and the loss
directly (no Hydra, datasets or sentencepiece), so it runs on a bare GPU machine with
PYTHONPATH pointing at this repository.

Prints target tokens/s, MFU against the measured bf16 matrix-product peak, peak memory, and
the projected wall time of the paper's schedule (100K updates for base, 300K for big, 25k
target tokens each) on 8 such GPUs.

    PYTHONPATH=. python scripts/bench_gpu.py                     # about 4 minutes on one H200
    PYTHONPATH=. python scripts/bench_gpu.py --device cpu --models tiny --steps 2 --warmup 1 --tokens 2000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from translate import flops  # noqa: E402
from translate.config import ModelConfig  # noqa: E402
from translate.loss import label_smoothed_nll  # noqa: E402
from translate.model import Transformer  # noqa: E402

SIZES = {
    "tiny": ModelConfig(d_model=256, d_ff=1024, heads=4, layers=3, dropout=0.1),
    "base": ModelConfig(d_model=512, d_ff=2048, heads=8, layers=6, dropout=0.1),
    "big": ModelConfig(d_model=1024, d_ff=4096, heads=16, layers=6, dropout=0.3),
}
PAPER_STEPS = {"tiny": 0, "base": 100_000, "big": 300_000}


def emit(**record) -> None:
    print(json.dumps(record), flush=True)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["base", "big"], choices=list(SIZES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, default=25000, help="target tokens per batch (and source tokens)")
    parser.add_argument("--length", type=int, default=32, help="sentence length in tokens (source and target)")
    parser.add_argument("--vocab", type=int, default=37000)
    parser.add_argument("--steps", type=int, default=40, help="timed updates per model")
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = True

    peak = flops.matmul_peak(device, dtype if device.type == "cuda" else torch.float32, seconds=2.0)
    emit(measurement="matmul_peak", device=str(torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
         dtype=args.precision, tflops=round(peak / 1e12, 1))

    for name in args.models:
        cfg = replace(SIZES[name], vocab_size=args.vocab)
        torch.manual_seed(0)
        model = Transformer(cfg).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
        step_model = torch.compile(model) if args.compile else model
        sentences = max(1, args.tokens // args.length)
        src = torch.randint(4, args.vocab, (sentences, args.length), device=device)
        tgt = torch.randint(4, args.vocab, (sentences, args.length + 1), device=device)
        tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
        real = torch.ones_like(tgt_out, dtype=torch.bool)
        target_tokens = int(real.sum())
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

        def update() -> None:
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                logits = step_model(src, tgt_in, real)
                loss, _ = label_smoothed_nll(logits, tgt_out[real], 0.1)
            (loss / target_tokens).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        for _ in range(args.warmup):
            update()
        synchronize(device)
        start = time.perf_counter()
        for _ in range(args.steps):
            update()
        synchronize(device)
        seconds = time.perf_counter() - start
        rate = target_tokens * args.steps / seconds
        per_token = flops.flops_per_target_token(cfg, args.length + 1, args.length + 1)
        per_update_8 = 25000 / 8 / rate  # seconds for one paper update shared by 8 such GPUs
        memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
        emit(measurement="train_gpu", model=name, precision=args.precision, compiled=args.compile,
             parameters=model.num_parameters(), target_tokens_per_batch=target_tokens,
             target_tokens_per_s=round(rate), mfu=round(rate * per_token / peak, 3),
             gflop_per_target_token=round(per_token / 1e9, 3), peak_memory_gb=memory and round(memory, 1),
             projected_paper_hours_on_8=round(PAPER_STEPS[name] * per_update_8 / 3600, 2))
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
