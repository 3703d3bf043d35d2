#!/usr/bin/env python
"""Training throughput on the CPU, side by side in one run: one JSON line per measurement.

Measures, on real Multi30k batches: the fp32 matrix-product peak of this machine, our training
step (target tokens/s, MFU against that peak, padding share), and a plain reference loop built
on torch.nn.Transformer with fixed-size sentence batches (no length bucketing).

    .venv/bin/python scripts/bench_train.py --model tiny --steps 30
    .venv/bin/python scripts/bench_train.py --model base --steps 8
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from translate.data.batching import collate, token_batches
from translate.data.preparation import prepare
from translate.data.vocabulary import OUR_LAYOUT
from translate.hydra_cli import load_config
from translate.model import Transformer
from translate.training import flops
from translate.training.loss import LabelSmoothedObjective
from translate.training.optim import build_optimizer
from translate.training.update import apply_update, train_step

PAD, BOS, EOS = OUR_LAYOUT.pad, OUR_LAYOUT.bos, OUR_LAYOUT.eos  # the tiny config trains its own vocabulary
ROOT = Path(__file__).resolve().parents[1]


def emit(**record) -> None:
    print(json.dumps(record), flush=True)


def matmul_peak(seconds: float = 3.0) -> float:
    """fp32 GFLOP/s of a large square matrix product with the current threads."""
    return flops.matmul_peak(torch.device("cpu"), seconds=seconds) / 1e9


class Reference(nn.Module):
    """A plain Transformer on torch.nn.Transformer: same sizes, tied embeddings, no tricks."""

    def __init__(self, cfg):
        super().__init__()
        self.d_model = cfg.d_model
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=PAD)
        self.transformer = nn.Transformer(
            cfg.d_model, cfg.heads, cfg.layers, cfg.layers, cfg.d_ff, cfg.dropout, batch_first=True
        )
        position = torch.arange(1024)[:, None]
        frequency = torch.exp(torch.arange(0, cfg.d_model, 2) * (-math.log(10000.0) / cfg.d_model))
        table = torch.zeros(1024, cfg.d_model)
        table[:, 0::2], table[:, 1::2] = torch.sin(position * frequency), torch.cos(position * frequency)
        self.register_buffer("positions", table)

    def forward(self, src, tgt_in):
        embed = lambda x: self.embedding(x) * math.sqrt(self.d_model) + self.positions[: x.size(1)]  # noqa: E731
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1))
        hidden = self.transformer(
            embed(src), embed(tgt_in), tgt_mask=causal,
            src_key_padding_mask=src == PAD, tgt_key_padding_mask=tgt_in == PAD, memory_key_padding_mask=src == PAD,
        )
        return hidden @ self.embedding.weight.T


def time_steps(run_one, batches, warmup: int):
    """Seconds and target tokens of the steps after `warmup` untimed ones."""
    for batch in batches[:warmup]:
        run_one(batch)
    start = time.perf_counter()
    tokens = sum(run_one(batch) for batch in batches[warmup:])
    return time.perf_counter() - start, tokens


def measure_ours(cfg, model_cfg, ours, warmup: int) -> float:
    """Our training step's target tokens/s on these batches (after `warmup` untimed ones)."""
    model = Transformer(model_cfg)
    optimizer, schedule = build_optimizer(model, cfg.optim, d_model=model_cfg.d_model, last_update=len(ours))
    objective = LabelSmoothedObjective(model, cfg.train.label_smoothing)

    def our_step(batch):
        stats = train_step(objective, [batch])
        apply_update(model, optimizer, schedule, None, cfg.optim.clip_norm)  # as the training loop
        return stats.target_tokens

    seconds, tokens = time_steps(our_step, ours, warmup)
    return tokens / seconds


def reference_batches(data, sentences: int, n: int):
    """n shuffled fixed-size batches of `sentences` pairs, padded to their longest member."""
    order = np.random.default_rng(1).permutation(len(data.train))
    batches = [collate(data.train, order[i * sentences : (i + 1) * sentences], data.vocabulary.specials) for i in range(n)]
    return [(b.src, b.tgt_in, b.tgt_out) for b in batches]


def measure_reference(cfg, model_cfg, batches, warmup: int) -> float:
    """The torch.nn.Transformer reference's target tokens/s on these batches."""
    reference = Reference(model_cfg)
    ref_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def reference_step(batch):
        src, tgt_in, tgt_out = batch
        logits = reference(src, tgt_in)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), tgt_out.view(-1), ignore_index=PAD,
                               label_smoothing=cfg.train.label_smoothing, reduction="sum")
        target_tokens = int((tgt_out != PAD).sum())
        (loss / target_tokens).backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad(set_to_none=True)
        return target_tokens

    seconds, tokens = time_steps(reference_step, batches, warmup)
    return tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", choices=["tiny", "base", "big"])
    parser.add_argument("--steps", type=int, default=30, help="timed updates per implementation")
    parser.add_argument("--warmup", type=int, default=3, help="untimed updates first")
    parser.add_argument("--tokens-per-batch", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--skip-reference", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    cfg = load_config("train", ["config=tiny", f"model={args.model}", "model.dropout=0.1"])
    data = prepare(cfg.data, log=lambda _: None)
    model_cfg = replace(cfg.model, vocab_size=len(data.vocabulary))
    split = data.train
    batches = token_batches(split.src_lengths, split.tgt_lengths, args.tokens_per_batch, seed=1, epoch=0)
    n = args.warmup + args.steps
    ours = [collate(split, b, data.vocabulary.specials) for b in batches[:n]]
    per_token = flops.flops_per_target_token(model_cfg, float(np.mean(split.src_lengths)) + 1,
                                             float(np.mean(split.tgt_lengths)) + 1)
    peak = matmul_peak()
    emit(measurement="matmul_peak", gflops=round(peak, 1), threads=args.threads)

    ours_rate = measure_ours(cfg, model_cfg, ours, args.warmup)
    padding = 1 - sum(b.real_tokens for b in ours) / sum(b.padded_tokens for b in ours)
    emit(measurement="train_ours", model=args.model, target_tokens_per_s=round(ours_rate, 1),
         mfu=round(ours_rate * per_token / (peak * 1e9), 3), gflop_per_target_token=round(per_token / 1e9, 4),
         padding=round(padding, 3), steps=args.steps, tokens_per_batch=args.tokens_per_batch)
    if args.skip_reference:
        return
    # The reference: as many sentences per batch as ours hold on average, so both see the same real tokens.
    sentences = max(1, round(sum(len(b.indices) for b in ours) / len(ours)))
    reference = reference_batches(data, sentences, n)
    reference_rate = measure_reference(cfg, model_cfg, reference, args.warmup)
    reference_padding = 1 - sum(int((s != PAD).sum() + (t != PAD).sum()) for s, _, t in reference) / sum(
        s.numel() + t.numel() for s, _, t in reference)
    emit(measurement="train_reference", model=args.model, target_tokens_per_s=round(reference_rate, 1),
         mfu=round(reference_rate * per_token / (peak * 1e9), 3), padding=round(reference_padding, 3),
         sentences_per_batch=sentences, steps=args.steps)
    emit(measurement="train_speedup", model=args.model, ours_over_reference=round(ours_rate / reference_rate, 2))


if __name__ == "__main__":
    main()
