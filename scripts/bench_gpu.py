#!/usr/bin/env python
"""GPU training throughput of base and big (bf16, synthetic tokens): one JSON line per measurement.

Needs only torch (and numpy, sentencepiece): it drives translate.training.update.train_step, the
optimizer and the schedule directly, without Hydra or datasets, so it runs on a bare GPU
machine with PYTHONPATH pointing at this repository.

For each model and batch size it prints target tokens/s, MFU against the bf16 matrix-product
peak (both the datasheet's, --spec-tflops, and the one measured here), peak memory, and the
projected wall time of the paper's schedule (100K updates for base, 300K for big, 25k target
tokens each): on one such GPU at 25k-token batches, and on 8 such GPUs at the per-GPU share of
an update (25000 / 8 tokens), assuming all-reduce is hidden behind the backward pass.

Side by side: `--compile` (model and loss, as train.compile=true) or `--compile model` (the
model alone); `--host-reads lagged immediate`: as the loop reads updates (one behind), then,
on the same model, with the host waiting for every update (as the loop did before);
`--profile PREFIX [--trace]` adds each kernel's device time (and the timeline) for three updates.

    python scripts/bench_gpu.py                     # about 3 minutes on one H200
    python scripts/bench_gpu.py --device cpu --models tiny --tokens 2000 --steps 2 --warmup 1
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from translate.core.config import ModelConfig, OptimConfig
from translate.data.batching import Batch
from translate.data.vocabulary import OUR_LAYOUT
from translate.model import Transformer
from translate.training import flops
from translate.training.distributed import Context
from translate.training.loss import LabelSmoothedObjective
from translate.training.optim import build_optimizer
from translate.training.update import QueuedUpdate, apply_update, train_step

PAD, BOS, EOS = OUR_LAYOUT.pad, OUR_LAYOUT.bos, OUR_LAYOUT.eos  # synthetic batches in our layout

SIZES = {
    "tiny": ModelConfig(d_model=256, d_ff=1024, heads=4, layers=3, dropout=0.1),
    "base": ModelConfig(d_model=512, d_ff=2048, heads=8, layers=6, dropout=0.1),
    "big": ModelConfig(d_model=1024, d_ff=4096, heads=16, layers=6, dropout=0.3),
}
PAPER_STEPS = {"tiny": 0, "base": 100_000, "big": 300_000}
PAPER_TOKENS_PER_UPDATE = 25_000


def emit(**record) -> None:
    print(json.dumps(record), flush=True)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synthetic_batch(tokens: int, mean_length: int, vocab: int, rng: np.random.Generator) -> Batch:
    """One length bucket of sentence pairs, as token_batches makes them: every sentence 1-3
    tokens shorter than the bucket's length, itself drawn from [mean/2, 3 mean/2]; about
    `tokens` padded tokens per side."""
    width = int(rng.integers(mean_length // 2, 3 * mean_length // 2 + 1)) + 1  # + EOS
    rows = max(1, tokens // width)
    lengths = rng.integers(max(1, width - 3), width, size=rows)
    src = torch.full((rows, width), PAD, dtype=torch.long)
    tgt_in, tgt_out = src.clone(), src.clone()
    for row, n in enumerate(lengths.tolist()):
        words = torch.from_numpy(rng.integers(4, vocab, size=n))
        src[row, :n], src[row, n] = words, EOS
        tgt_in[row, 0], tgt_in[row, 1 : n + 1] = BOS, words
        tgt_out[row, :n], tgt_out[row, n] = words, EOS
    return Batch(src, tgt_in, tgt_out, np.arange(rows), PAD)


def utilisation(name: str, tokens: int, rate: float, per_token: float, peaks) -> dict:
    """MFU against the measured (and the spec) peak, and the paper's schedule projected at this
    rate: on one GPU where it does the whole 25k-token update, else on the GPUs that share it."""
    record = {"mfu_measured_peak": round(rate * per_token / peaks["measured"], 3)}
    if "spec" in peaks:
        record["mfu_spec_peak"] = round(rate * per_token / peaks["spec"], 3)
    hours_per_update = PAPER_TOKENS_PER_UPDATE / rate / 3600
    if PAPER_STEPS[name]:
        if tokens >= PAPER_TOKENS_PER_UPDATE:  # one GPU does the whole update
            record["projected_paper_hours_on_1"] = round(PAPER_STEPS[name] * hours_per_update, 1)
        else:  # the per-GPU share of an update shared by 25000 / tokens GPUs
            gpus = round(PAPER_TOKENS_PER_UPDATE / tokens)
            record[f"projected_paper_hours_on_{gpus}"] = round(PAPER_STEPS[name] * hours_per_update / gpus, 2)
    return record


def measure(name: str, cfg: ModelConfig, tokens: int, args, device, dtype, peaks) -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = Transformer(cfg, pad_id=PAD).to(device)
    optimizer, schedule = build_optimizer(model, OptimConfig(), d_model=cfg.d_model, last_update=args.warmup + args.steps,
                                          device=device)
    objective = LabelSmoothedObjective(model, 0.1)
    if args.compile == "objective":  # as train.compile=true: the model and its loss, one graph
        objective = torch.compile(objective, dynamic=True)
    elif args.compile == "model":  # the model alone; the loss runs eagerly (for comparison)
        objective = LabelSmoothedObjective(torch.compile(model, dynamic=True), 0.1)
    batches = [synthetic_batch(tokens, args.length, cfg.vocab_size, rng) for _ in range(8)]
    autocast = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else None
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)

    pending = []  # the last update's outcome, not yet read

    def update(i: int, host_reads: str = "lagged") -> None:  # as translate.training.trainer's loop, one micro-batch per update
        stats = train_step(objective, [batches[i % len(batches)]], Context(device=device), autocast)
        grad_norm, lr = apply_update(model, optimizer, schedule, None, 0.0)
        pending.append(QueuedUpdate(stats, grad_norm, lr))
        # As the loop: the previous update is read once this one is queued; "immediate": the host
        # waits for this update before queueing the next (what the loop did before 2026-11-29).
        while len(pending) > (0 if host_reads == "immediate" else 1):
            pending.pop(0).read()

    started = time.perf_counter()
    for i in range(args.warmup):
        update(i)
    synchronize(device)
    warmup_seconds = time.perf_counter() - started
    target = sum(batches[i % len(batches)].target_tokens for i in range(args.steps))
    real = sum(batches[i % len(batches)].real_tokens for i in range(args.steps))
    padded = sum(batches[i % len(batches)].padded_tokens for i in range(args.steps))
    rows = sum(len(batches[i % len(batches)].indices) for i in range(args.steps))
    per_token = flops.flops_per_target_token(cfg, target / rows, target / rows)  # source as long as target
    rates = {}
    for host_reads in args.host_reads:  # side by side, on the same compiled model
        start = time.perf_counter()
        for i in range(args.steps):
            update(i, host_reads)
        synchronize(device)
        pending.clear()
        rate = rates[host_reads] = target / (time.perf_counter() - start)
        record = dict(
            measurement="train_gpu", model=name, precision=args.precision, compiled=args.compile, host_reads=host_reads,
            parameters=model.num_parameters(), tokens_per_batch=tokens, target_tokens_per_batch=round(target / args.steps),
            padding=round(1 - real / padded, 3), steps=args.steps, warmup_s=round(warmup_seconds, 1),
            target_tokens_per_s=round(rate), gflop_per_target_token=round(per_token / 1e9, 3),
            peak_memory_gb=round(torch.cuda.max_memory_allocated(device) / 2**30, 1) if device.type == "cuda" else None,
            **utilisation(name, tokens, rate, per_token, peaks),
        )
        if host_reads != args.host_reads[0]:
            record[f"ratio_to_{args.host_reads[0]}"] = round(rate / rates[args.host_reads[0]], 3)
        emit(**record)
    if args.profile:
        profile(update, args, device, f"{args.profile}.{name}.{tokens}.{args.compile or 'eager'}")


def profile(update, args, device, prefix: str) -> None:
    """Device time of a few updates by kernel: the table to prefix.txt, shares by kind as a JSON
    line, and with --trace the timeline to prefix.json.gz (chrome://tracing, Perfetto)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profiler(activities=activities) as prof:
        for i in range(3):
            update(i)
        synchronize(device)
    events = [e for e in prof.key_averages() if e.device_type.name == ("CUDA" if device.type == "cuda" else "CPU")]
    kinds = {"matmul": ("gemm", "nvjet", "cutlass", "xmma", "addmm", "mm"), "attention": ("fmha", "flash", "attention", "sdpa"),
             "optimizer": ("adam", "multi_tensor", "foreach", "norm_"), "loss": ("softmax", "gather", "nll", "scatter"),
             "fused": ("triton",)}
    shares = dict.fromkeys(list(kinds) + ["other"], 0.0)
    spent = (lambda e: e.self_device_time_total) if device.type == "cuda" else (lambda e: e.self_cpu_time_total)
    total = sum(spent(e) for e in events) or 1.0
    for e in events:
        kind = next((k for k, words in kinds.items() if any(w in e.key.lower() for w in words)), "other")
        shares[kind] += spent(e) / total
    sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    Path(f"{prefix}.txt").write_text(prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=90))
    if args.trace:
        prof.export_chrome_trace(f"{prefix}.json.gz")
    emit(measurement="profile", table=f"{prefix}.txt", device_ms_per_update=round(total / 3 / 1000, 1),
         **{f"share_{k}": round(v, 3) for k, v in shares.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["base", "big"], choices=list(SIZES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, nargs="+", default=[25000, 3125],
                        help="padded tokens per batch and side: the paper's update on one GPU, its share on 8")
    parser.add_argument("--length", type=int, default=28, help="mean sentence length in tokens")
    parser.add_argument("--vocab", type=int, default=37000)
    parser.add_argument("--steps", type=int, default=100, help="timed updates per measurement")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--compile", nargs="?", const="objective", choices=["objective", "model"],
                        help="torch.compile the model and loss together (train.compile=true), or the model alone")
    parser.add_argument("--profile", metavar="PREFIX", help="also profile 3 updates; kernel tables to PREFIX.<model>.<tokens>.<mode>.txt")
    parser.add_argument("--trace", action="store_true", help="with --profile, also write the timeline (PREFIX...json.gz)")
    parser.add_argument("--host-reads", nargs="+", default=["lagged"], choices=["lagged", "immediate"],
                        help="read each update's loss and gradient norm once the next is queued (as the loop does), "
                             "or at once, making the host wait for the device every update; both: side by side")
    parser.add_argument("--spec-tflops", type=float, default=989.0, help="datasheet dense peak (H100/H200 SXM bf16)")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    peaks = {"measured": flops.matmul_peak(device, dtype if device.type == "cuda" else torch.float32, seconds=2.0)}
    if device.type == "cuda" and args.precision == "bf16":
        peaks["spec"] = args.spec_tflops * 1e12
    emit(measurement="matmul_peak", device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
         torch=torch.__version__, dtype=args.precision, tflops=round(peaks["measured"] / 1e12, 1),
         spec_tflops=args.spec_tflops if "spec" in peaks else None)
    for name in args.models:
        for tokens in args.tokens:
            measure(name, replace(SIZES[name], vocab_size=args.vocab), tokens, args, device, dtype, peaks)


if __name__ == "__main__":
    main()
