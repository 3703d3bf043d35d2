"""The `translate train` verb: teacher forcing, label-smoothed cross-entropy, Adam with warmup.

Knows nothing of Hydra: takes the typed TranslateConfig.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Deque, Dict, Optional

import numpy as np
import torch
from torch import nn

from translate import checkpoint, distributed, flops, paths, resume
from translate.config import TranslateConfig
from translate.data.batching import BatchStream, collate
from translate.data.cache import prepare, write_report
from translate.data.vocabulary import PAD
from translate.errors import TranslateError
from translate.loss import LabelSmoothedObjective
from translate.model import Transformer
from translate.optim import build_optimizer
from translate.step import QueuedUpdate, StepStats, apply_update, batch_plan, train_step, unstep
from translate.validate import Tracker, dev_sentences, validate

log = logging.getLogger("translate.train")


def train(cfg: TranslateConfig) -> Path:
    """Train until train.max_steps updates or train.max_minutes; returns the last checkpoint.

    Under torchrun every process trains its share of each update (DistributedDataParallel);
    only the main process logs and writes checkpoints.
    """
    context = distributed.init()
    # What a run changes in the process comes back afterwards, so that the next job of a
    # multirun sweep (run one after another in this process) starts clean.
    threads, level = torch.get_num_threads(), log.level
    try:
        return _train(cfg, context)
    finally:
        distributed.shutdown()
        torch.set_num_threads(threads)
        log.setLevel(level)


def _train(cfg: TranslateConfig, context: distributed.Context) -> Path:
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    if not context.is_main:
        log.setLevel(logging.WARNING)
    torch.manual_seed(cfg.train.seed)  # the same initial weights on every process
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)

    data = prepare(cfg.data, log=log.info)  # one process prepares, the others wait for it
    if context.is_main:
        write_report(data, run_dir / "data_report.json")
    vocabulary = data.vocabulary
    model_cfg = replace(cfg.model, vocab_size=len(vocabulary))
    model = Transformer(model_cfg, pad_id=PAD).to(context.device)
    optimizer, scheduler = build_optimizer(model, cfg.optim, model_cfg.d_model)
    precision = resolve_precision(cfg.train.precision, context.device)
    scaler = torch.amp.GradScaler(context.device.type) if precision == "fp16" else None
    autocast = None if precision == "fp32" else torch.autocast(context.device.type, dtype=_DTYPES[precision])
    last_path = run_dir / paths.LAST_CHECKPOINT
    step = 0
    resumed: Optional[Dict] = None
    if last_path.is_file():
        resumed = _resume(last_path, model, model_cfg, vocabulary, optimizer, scheduler, scaler)
        step = int(resumed["step"])
        log.info(f"resuming from {last_path} at update {step}")
    elif cfg.train.init_from:
        _init_from(Path(cfg.train.init_from), model, model_cfg, vocabulary)
        log.info(f"starting from the weights of {cfg.train.init_from} (fresh optimizer and schedule)")
    if step >= cfg.train.max_steps:
        log.info(f"{last_path} already has {step} updates (train.max_steps={cfg.train.max_steps}): nothing to do")
        return last_path
    torch.manual_seed(cfg.train.seed + 1000 * context.rank)  # dropout differs between processes

    tokens_per_batch, accumulation = batch_plan(cfg.train.tokens_per_update, cfg.train.tokens_per_batch, context.world_size)
    log.info(
        f"model: {model.num_parameters():,} parameters ({model_cfg.layers}+{model_cfg.layers} layers, "
        f"d_model {model_cfg.d_model}, d_ff {model_cfg.d_ff}, {model_cfg.heads} heads, vocabulary {len(vocabulary):,}); "
        f"{len(data.train):,} training pairs; {tokens_per_batch} tokens per batch x {accumulation} "
        f"accumulation x {context.world_size} processes; {precision} on {context.device}; "
        f"{torch.get_num_threads()} threads"
    )
    # Compute accounting: model FLOPs per target token at this corpus's average lengths, and
    # the device's measured matrix-product peak in the training precision, for the MFU.
    per_token = flops.flops_per_target_token(
        model_cfg, float(np.mean(data.train.src_lengths)) + 1, float(np.mean(data.train.tgt_lengths)) + 1
    )
    # (On CPUs the fp32 peak: their bf16/fp16 products are emulated, and far slower.)
    peak_dtype = _DTYPES.get(precision, torch.float32) if context.device.type == "cuda" else torch.float32
    peak = flops.matmul_peak(context.device, peak_dtype, seconds=0.5) if context.is_main else 0.0
    paper_compute = flops.PAPER_COMPUTE.get(model_cfg.d_model) if model_cfg.layers == 6 else None
    accounting = Accounting(per_token, peak * context.world_size, paper_compute, context.device)
    log.info(f"{per_token / 1e9:.3f} GFLOP per target token; device peak {peak / 1e12:.2f} TFLOP/s ({precision})")
    wrapped = LabelSmoothedObjective(model, cfg.train.label_smoothing)
    if context.distributed:
        device_ids = [context.device] if context.device.type == "cuda" else None
        wrapped = nn.parallel.DistributedDataParallel(wrapped, device_ids=device_ids)
    if cfg.train.compile:
        # After DDP, so that the compiler splits the graph at DDP's gradient buckets and their
        # all-reduce still overlaps the backward pass (one compiled backward would hold every
        # gradient back to its end). Dynamic: batch shapes vary with the length bucket.
        wrapped = torch.compile(wrapped, dynamic=True)
    model.train()
    batches = BatchStream(data.train.src_lengths, data.train.tgt_lengths, tokens_per_batch, cfg.train.seed,
                          context.rank, context.world_size)
    tracker = Tracker(cfg.valid.metric)
    if resumed is not None:
        resume.restore_process_state(resumed, context, batches, tracker)
    dev = dev_sentences(cfg) if context.is_main and cfg.valid.every_steps and cfg.valid.bleu_sentences else None
    nonfinite_in_a_row = 0
    skipped = int(resumed.get("skipped_updates", 0)) if resumed is not None else 0  # over the whole run
    started = time.monotonic()
    deadline = started + 60 * cfg.train.max_minutes if cfg.train.max_minutes else math.inf
    window, window_start, totals = StepStats(), started, StepStats()

    last_saved = time.monotonic()
    saved_at: Optional[int] = None  # the update of the last checkpoint this run wrote

    def save() -> None:
        """checkpoint_last.pt (full state, for resuming exactly: every process's random state
        and data position too) and a numbered copy of the weights (for averaging); numbered
        ones beyond checkpoint.keep_last are deleted."""
        nonlocal last_saved, saved_at
        settle()  # the weights hold every queued update: count them all
        last_saved, saved_at = time.monotonic(), step
        states = resume.gather_process_states(context, batches)
        if not context.is_main:
            return
        weights = checkpoint.weights(model, model_cfg, vocabulary.model_bytes, [cfg.data.src_lang, cfg.data.tgt_lang], step)
        payload = {**weights, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "config": asdict(cfg),
                   "processes": states, "valid": tracker.state_dict(), "skipped_updates": skipped}
        if scaler is not None:
            payload["scaler"] = scaler.state_dict()
        checkpoint.save(last_path, payload)
        checkpoint.save(paths.numbered_checkpoint(run_dir, step), weights)  # for averaging
        checkpoint.prune(run_dir, cfg.checkpoint.keep_last)

    def save_due(n: int) -> bool:
        """Whether a checkpoint is due after update n."""
        minutes = cfg.checkpoint.every_minutes
        return _every(n, cfg.checkpoint.every_steps) or (minutes is not None and time.monotonic() - last_saved >= 60 * minutes)

    def stop_reason() -> Optional[str]:
        """A stop signal or time up, agreed by all processes so that none waits for the others."""
        seen = [float(stop_signal.received is not None), float(time.monotonic() >= deadline)]
        signal_seen, time_up = distributed.all_sum(seen, context)
        return "signal" if signal_seen else ("time" if time_up else None)

    # Updates are read one behind: an update's gradient norm and loss sums are read once the
    # next update is queued, so the device always has work while the host waits for them. At a
    # boundary (log, checkpoint, validation, the last update) the update is read at once.
    queued: Deque[QueuedUpdate] = deque()
    last_norm = last_lr = 0.0

    def settle(keep: int = 0) -> None:
        """Read the queued updates but the newest `keep`: count each, or count it as dropped."""
        nonlocal step, skipped, nonfinite_in_a_row, last_norm, last_lr
        while len(queued) > keep:
            norm, loss, nll = queued[0].read()  # interrupted here, the queue is as it was
            update = queued.popleft()
            if not math.isfinite(norm):
                skipped += 1
                nonfinite_in_a_row += 1
                unstep(scheduler)
                log.warning(f"update {step + 1}: non-finite loss or gradient, skipped ({skipped} so far)")
                if nonfinite_in_a_row >= cfg.train.max_nonfinite:
                    good = last_path if last_path.is_file() else "none yet"
                    raise TranslateError(
                        f"{nonfinite_in_a_row} non-finite updates in a row at update {step + 1}: stopping; "
                        f"last good checkpoint: {good}"
                    )
                continue
            nonfinite_in_a_row = 0
            step += 1
            last_norm, last_lr = norm, update.lr
            update.stats.loss, update.stats.nll = loss, nll
            window.add(update.stats)
            totals.add(update.stats)
            if progress is not None:
                progress.update(1)

    def boundary(n: int) -> bool:
        """Whether something happens after update n (so that it must be read at once)."""
        return n >= cfg.train.max_steps or _every(n, cfg.train.log_every) or _every(n, cfg.valid.every_steps) or save_due(n)

    # The writer, the progress bar and the signal handlers are undone in the finally below,
    # however the loop ends.
    writer = progress = stop_signal = None
    try:
        writer = _summary_writer(run_dir) if context.is_main else None
        progress = _progress(cfg.train.max_steps, step) if context.is_main else None
        stop_signal = resume.StopSignals()
        while step < cfg.train.max_steps:
            reason = stop_reason()
            if reason is not None:
                settle()
            if reason == "time":
                break
            if reason == "signal":
                save()
                raise TranslateError(
                    f"stopped by {stop_signal.name or 'a stop signal on another process'} at update {step}: "
                    f"saved {last_path}; run the same command to resume"
                )
            micro = [collate(data.train, next(batches)) for _ in range(accumulation)]
            stats = train_step(wrapped, micro, context, autocast, scaler)
            lr = scheduler.get_last_lr()[0]
            grad_norm = apply_update(model, optimizer, scheduler, scaler, cfg.optim.clip_norm)
            queued.append(QueuedUpdate(stats, grad_norm, lr))
            settle(keep=1)  # the previous update, while the device works on this one
            if not boundary(step + 1):
                continue
            before = step
            settle()
            if step == before:  # dropped: nothing happened
                continue
            if _every(step, cfg.train.log_every) or step == cfg.train.max_steps:
                window = window.summed(context)
                if context.is_main:
                    _log_window(writer, step, last_lr, window, time.monotonic() - window_start, accounting)
                    writer.add_scalar("train/grad_norm", last_norm, step)
                    writer.add_scalar("train/skipped_updates", skipped, step)
                window, window_start = StepStats(), time.monotonic()
            if save_due(step):
                save()
            if _every(step, cfg.valid.every_steps) and data.valid is not None:
                if validate(cfg, context, model, data, vocabulary, tracker, dev, writer, step, run_dir):
                    save()
                    log.info(f"early stopping at update {step}: no better {cfg.valid.metric} in {cfg.valid.patience} validations")
                    break
    except KeyboardInterrupt:
        save()
        log.info(f"interrupted at update {step}: saved {last_path}")
        raise
    finally:
        if stop_signal is not None:
            stop_signal.restore()
        if progress is not None:
            progress.close()
        if writer is not None:
            writer.close()
    settle()
    if saved_at != step:  # early stopping, say, has just saved
        save()
    elapsed = time.monotonic() - started
    totals = totals.summed(context)
    if totals.target_tokens:
        log.info(
            f"stopped at update {step} after {elapsed / 60:.1f} min: {totals.target_tokens / elapsed:.0f} target tokens/s, "
            f"padding {totals.padding:.1%}, loss {totals.loss / totals.target_tokens:.3f}; checkpoint {last_path}"
        )
    return last_path


def _every(n: int, period: int) -> bool:
    """Whether something done every `period` updates (0: never) is due after update n."""
    return bool(period) and n % period == 0


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(precision: str, device: torch.device) -> str:
    """auto: bf16 on GPUs, fp32 on CPUs (bf16 matrix products are slow on CPUs without it)."""
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    if precision not in ("fp32", "bf16", "fp16"):
        raise TranslateError(f"train.precision={precision!r}: choose from auto, fp32, bf16, fp16")
    return precision


@dataclass
class Accounting:
    """What the logs report about compute: FLOPs per token, peak (all processes), progress."""

    flops_per_token: float
    peak_flops: float  # FLOP/s of all processes together
    paper_compute: Optional[float]  # the paper's total training FLOPs for this model size
    device: torch.device
    done: float = 0.0  # model FLOPs so far in this run

    def peak_memory_gb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**30
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB -> GB


def _log_window(writer, step: int, lr: float, window: StepStats, seconds: float, accounting: Accounting) -> None:
    """TensorBoard scalars and one log line for the updates since the last report."""
    rate = window.target_tokens / seconds
    accounting.done += window.target_tokens * accounting.flops_per_token
    metrics = {
        "loss": window.loss / window.target_tokens,
        "nll": window.nll / window.target_tokens,
        "ppl": math.exp(min(window.nll / window.target_tokens, 50)),
        "lr": lr,
        "target_tokens_per_s": rate,
        "padding": window.padding,
        "mfu": rate * accounting.flops_per_token / accounting.peak_flops if accounting.peak_flops else 0.0,
        "peak_memory_gb": accounting.peak_memory_gb(),
        "model_flops": accounting.done,
    }
    if accounting.paper_compute:
        metrics["paper_compute_share"] = accounting.done / accounting.paper_compute
    for name, value in metrics.items():
        writer.add_scalar(f"train/{name}", value, step)
    share = f" ({metrics['paper_compute_share']:.2%} of the paper's)" if accounting.paper_compute else ""
    log.info(
        f"update {step}: loss {metrics['loss']:.3f} nll {metrics['nll']:.3f} ppl {metrics['ppl']:.1f} "
        f"lr {lr:.2e} {rate:.0f} tgt tok/s padding {metrics['padding']:.1%} mfu {metrics['mfu']:.0%} "
        f"mem {metrics['peak_memory_gb']:.1f} GB compute {accounting.done:.2e} FLOPs{share}"
    )


def _check_compatible(path: Path, payload: Dict, model_cfg, vocabulary) -> None:
    difference = checkpoint.describe_difference(checkpoint.model_config(payload), model_cfg)
    if difference:
        raise TranslateError(f"{path} holds a different model ({difference}): use another run_dir, or move the checkpoint away")
    if payload["vocabulary"] != vocabulary.model_bytes:
        raise TranslateError(f"{path} was trained with another vocabulary: use another run_dir")


def _resume(path: Path, model, model_cfg, vocabulary, optimizer, scheduler, scaler=None) -> Dict:
    """Load everything a checkpoint_last.pt holds; returns the payload for the process states."""
    payload = checkpoint.load(path)
    _check_compatible(path, payload, model_cfg, vocabulary)
    model.load_state_dict(payload["model"])
    if "optimizer" in payload:
        optimizer.load_state_dict(payload["optimizer"])
        scheduler.load_state_dict(payload["scheduler"])
    if scaler is not None and "scaler" in payload:
        scaler.load_state_dict(payload["scaler"])
    return payload


def _init_from(path: Path, model, model_cfg, vocabulary) -> None:
    """Fine-tuning: another run's weights, nothing else."""
    payload = checkpoint.load(path)
    _check_compatible(path, payload, model_cfg, vocabulary)
    model.load_state_dict(payload["model"])


def _summary_writer(run_dir: Path):
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(run_dir / "tensorboard"))


def _progress(total: int, initial: int):
    """A tqdm bar on an interactive terminal (log lines still go to the log file and console)."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="update", dynamic_ncols=True)
