"""The `translate train` verb: teacher forcing, label-smoothed cross-entropy, Adam with warmup.

Knows nothing of Hydra: takes the typed TranslateConfig.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import numpy as np
import torch
from torch import nn

from translate import checkpoint, paths
from translate.config import TranslateConfig
from translate.data.batching import Batch, collate, shard, token_batches
from translate.data.cache import EncodedSplit, prepare, write_report
from translate.data.vocabulary import PAD
from translate.errors import TranslateError
from translate.loss import label_smoothed_nll
from translate.model import Transformer
from translate.optim import build_optimizer

log = logging.getLogger("translate.train")


@dataclass
class StepStats:
    """Sums over the micro-batches of one update."""

    loss: float = 0.0  # label-smoothed loss, summed over target tokens
    nll: float = 0.0  # negative log-likelihood, summed over target tokens
    target_tokens: int = 0
    padded_tokens: int = 0  # source + target positions, padding included
    real_tokens: int = 0  # source + target positions without padding

    def add(self, other: "StepStats") -> None:
        for name in ("loss", "nll", "target_tokens", "padded_tokens", "real_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def padding(self) -> float:
        """Share of padded positions among all source and target positions."""
        return 1 - self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0


def accumulation_steps(tokens_per_update: int, tokens_per_batch: int, world_size: int = 1) -> int:
    """Micro-batches per process per update, so the update size does not depend on the world size."""
    return max(1, math.ceil(tokens_per_update / (tokens_per_batch * world_size)))


def epoch_batches(
    split: EncodedSplit, tokens_per_batch: int, seed: int, rank: int = 0, world_size: int = 1
) -> Iterator[np.ndarray]:
    """Endless stream of this process's batches (index arrays), reshuffled every epoch."""
    src_lengths, tgt_lengths = split.src_lengths, split.tgt_lengths
    epoch = 0
    while True:
        yield from shard(token_batches(src_lengths, tgt_lengths, tokens_per_batch, seed, epoch), rank, world_size)
        epoch += 1


def train_step(model: nn.Module, batches: List[Batch], label_smoothing: float) -> StepStats:
    """Forward and backward over the micro-batches of one update; gradients end up as those of
    the loss summed over all target tokens divided by their number (as one big batch)."""
    stats = StepStats(target_tokens=sum(b.target_tokens for b in batches))
    for batch in batches:
        memory, src_mask = model.encode(batch.src)
        hidden = model.decode(batch.tgt_in, memory, src_mask)  # (B, T, D)
        real = batch.tgt_out != PAD  # (B, T)
        # Project only real positions to the vocabulary: padding costs no softmax.
        logits = model.logits(hidden[real])  # (N, V)
        loss, nll = label_smoothed_nll(logits, batch.tgt_out[real], label_smoothing)
        (loss / stats.target_tokens).backward()
        stats.loss += loss.item()
        stats.nll += nll.item()
        stats.padded_tokens += batch.padded_tokens
        stats.real_tokens += batch.real_tokens
    return stats


def _checkpoint_payload(cfg, model, model_cfg, vocabulary, optimizer, scheduler, step) -> Dict:
    return {
        "model": checkpoint.plain_state_dict(model),
        "model_config": asdict(model_cfg),
        "vocabulary": vocabulary.model_bytes,
        "languages": [cfg.data.src_lang, cfg.data.tgt_lang],
        "step": step,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "config": asdict(cfg),
    }


def train(cfg: TranslateConfig) -> Path:
    """Train until train.max_steps updates or train.max_minutes; returns the last checkpoint."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise TranslateError("several processes are not supported yet: run with --nproc_per_node=1")
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    torch.manual_seed(cfg.train.seed)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)

    data = prepare(cfg.data, log=log.info)
    write_report(data, run_dir / "data_report.json")
    vocabulary = data.vocabulary
    model_cfg = replace(cfg.model, vocab_size=len(vocabulary))
    model = Transformer(model_cfg, pad_id=PAD)
    optimizer, scheduler = build_optimizer(model, cfg.optim, model_cfg.d_model)
    last_path = run_dir / paths.LAST_CHECKPOINT
    step = 0
    if last_path.is_file():
        step = _resume(last_path, model, model_cfg, vocabulary, optimizer, scheduler)
        log.info(f"resuming from {last_path} at update {step}")
    if step >= cfg.train.max_steps:
        log.info(f"{last_path} already has {step} updates (train.max_steps={cfg.train.max_steps}): nothing to do")
        return last_path

    accumulation = accumulation_steps(cfg.train.tokens_per_update, cfg.train.tokens_per_batch)
    log.info(
        f"model: {model.num_parameters():,} parameters ({model_cfg.layers}+{model_cfg.layers} layers, "
        f"d_model {model_cfg.d_model}, d_ff {model_cfg.d_ff}, {model_cfg.heads} heads, vocabulary {len(vocabulary):,}); "
        f"{len(data.train):,} training pairs; {cfg.train.tokens_per_batch} tokens per batch x {accumulation} "
        f"accumulation; {torch.get_num_threads()} threads"
    )
    writer = _summary_writer(run_dir)
    progress = _progress(cfg.train.max_steps, step)
    model.train()
    batches = epoch_batches(data.train, cfg.train.tokens_per_batch, cfg.train.seed + step)
    started = time.monotonic()
    deadline = started + 60 * cfg.train.max_minutes if cfg.train.max_minutes else math.inf
    window, window_start, totals = StepStats(), started, StepStats()

    def save() -> None:
        checkpoint.save(last_path, _checkpoint_payload(cfg, model, model_cfg, vocabulary, optimizer, scheduler, step))

    try:
        while step < cfg.train.max_steps and time.monotonic() < deadline:
            micro = [collate(data.train, next(batches)) for _ in range(accumulation)]
            stats = train_step(model, micro, cfg.train.label_smoothing)
            if cfg.optim.clip_norm > 0:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.clip_norm)
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            window.add(stats)
            totals.add(stats)
            if progress is not None:
                progress.update(1)
            if step % cfg.train.log_every == 0 or step == cfg.train.max_steps:
                _log_window(writer, step, lr, window, time.monotonic() - window_start)
                window, window_start = StepStats(), time.monotonic()
            if step % cfg.train.save_every == 0:
                save()
    except KeyboardInterrupt:
        log.info(f"interrupted at update {step}: saving {last_path}")
        save()
        raise
    finally:
        if progress is not None:
            progress.close()
        writer.close()
    save()
    elapsed = time.monotonic() - started
    if totals.target_tokens:
        log.info(
            f"stopped at update {step} after {elapsed / 60:.1f} min: {totals.target_tokens / elapsed:.0f} target tokens/s, "
            f"padding {totals.padding:.1%}, loss {totals.loss / totals.target_tokens:.3f}; checkpoint {last_path}"
        )
    return last_path


def _log_window(writer, step: int, lr: float, window: StepStats, seconds: float) -> None:
    """TensorBoard scalars and one log line for the updates since the last report."""
    metrics = {
        "loss": window.loss / window.target_tokens,
        "nll": window.nll / window.target_tokens,
        "ppl": math.exp(min(window.nll / window.target_tokens, 50)),
        "lr": lr,
        "target_tokens_per_s": window.target_tokens / seconds,
        "padding": window.padding,
    }
    for name, value in metrics.items():
        writer.add_scalar(f"train/{name}", value, step)
    log.info(
        f"update {step}: loss {metrics['loss']:.3f} nll {metrics['nll']:.3f} ppl {metrics['ppl']:.1f} "
        f"lr {lr:.2e} {metrics['target_tokens_per_s']:.0f} tgt tok/s padding {metrics['padding']:.1%}"
    )


def _resume(path: Path, model, model_cfg, vocabulary, optimizer, scheduler) -> int:
    payload = checkpoint.load(path)
    saved_cfg = checkpoint.model_config(payload)
    difference = checkpoint.describe_difference(saved_cfg, model_cfg)
    if difference:
        raise TranslateError(
            f"{path} holds a different model ({difference}): use another run_dir, or move the checkpoint away"
        )
    if payload["vocabulary"] != vocabulary.model_bytes:
        raise TranslateError(f"{path} was trained with another vocabulary: use another run_dir")
    model.load_state_dict(payload["model"])
    if "optimizer" in payload:
        optimizer.load_state_dict(payload["optimizer"])
        scheduler.load_state_dict(payload["scheduler"])
    return int(payload["step"])


def _summary_writer(run_dir: Path):
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(run_dir / "tensorboard"))


def _progress(total: int, initial: int):
    """A tqdm bar on an interactive terminal (log lines still go to the log file and console)."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="update", dynamic_ncols=True)
