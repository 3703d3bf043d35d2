"""The `translate train` verb: teacher forcing, label-smoothed cross-entropy, Adam with warmup.

Knows nothing of Hydra: takes the typed TranslateConfig.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Deque, Dict, List, Optional, Tuple, Union

import numpy as np
import torch
from torch import nn

from translate import checkpoint, distributed, flops, paths, resume
from translate.config import TranslateConfig
from translate.data.batching import Batch, BatchStream, collate, to_device
from translate.data.cache import prepare, write_report
from translate.data.vocabulary import PAD
from translate.errors import TranslateError
from translate.loss import LabelSmoothedObjective
from translate.model import Transformer
from translate.optim import build_optimizer
from translate.validate import Tracker, dev_sentences, validate

log = logging.getLogger("translate.train")


class QueuedUpdate:
    """One queued update's outcome on its way to the host: its gradient norm and loss sums are
    copied into pinned memory right behind the update's own work, with an event that waits for
    that copy alone. (A plain .item() would also wait for every update queued after it.)"""

    def __init__(self, stats: "StepStats", grad_norm: torch.Tensor, lr: float):
        self.stats, self.lr = stats, lr
        values = torch.stack([grad_norm.float().reshape(()), stats.loss.float(), stats.nll.float()])  # (3,)
        if values.is_cuda:
            self.host = torch.empty(3, dtype=torch.float32, pin_memory=True)
            self.host.copy_(values, non_blocking=True)
            self.ready: Optional[torch.cuda.Event] = torch.cuda.Event()
            self.ready.record()
        else:
            self.host, self.ready = values, None

    def read(self) -> Tuple[float, float, float]:
        """(gradient norm, loss sum, NLL sum); waits for the device up to this update only."""
        if self.ready is not None:
            self.ready.synchronize()
        norm, loss, nll = self.host.tolist()
        return norm, loss, nll


@dataclass
class StepStats:
    """Sums over the micro-batches of one update."""

    # Label-smoothed loss and NLL, summed over target tokens: device tensors until the loop
    # reads them (QueuedUpdate), so that an update never makes the host wait for the device.
    loss: Union[float, torch.Tensor] = 0.0
    nll: Union[float, torch.Tensor] = 0.0
    target_tokens: int = 0
    padded_tokens: int = 0  # source + target positions, padding included
    real_tokens: int = 0  # source + target positions without padding

    def add(self, other: "StepStats") -> None:
        for name in ("loss", "nll", "target_tokens", "padded_tokens", "real_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def summed(self, context: distributed.Context) -> "StepStats":
        """These sums over all processes."""
        names = ("loss", "nll", "target_tokens", "padded_tokens", "real_tokens")
        values = distributed.all_sum([float(getattr(self, n)) for n in names], context)
        return StepStats(*values[:2], *(int(v) for v in values[2:]))

    @property
    def padding(self) -> float:
        """Share of padded positions among all source and target positions."""
        return 1 - self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0


def batch_plan(tokens_per_update: int, tokens_per_batch: int, world_size: int = 1) -> Tuple[int, int]:
    """(tokens per micro-batch, micro-batches per process per update), so that an update holds
    about tokens_per_update tokens whatever the number of processes: the per-process batch
    shrinks to tokens_per_update / world_size where tokens_per_batch is larger (the paper's
    25k-token update on 8 GPUs: 3,125 each), and batches accumulate where it is smaller."""
    per_batch = min(tokens_per_batch, math.ceil(tokens_per_update / world_size))
    return per_batch, max(1, math.ceil(tokens_per_update / (per_batch * world_size)))


def train_step(
    objective: nn.Module,
    batches: List[Batch],
    context: distributed.Context = distributed.Context(),
    autocast: Optional[torch.autocast] = None,
    scaler: Optional["torch.amp.GradScaler"] = None,
) -> StepStats:
    """Forward and backward over this process's micro-batches of one update.

    objective: (src, tgt_in, select, target) -> summed loss and NLL, a LabelSmoothedObjective,
    maybe compiled and wrapped in DistributedDataParallel.

    The gradients end up as those of the loss summed over every target token of the update,
    on all processes, divided by their number: as one large batch on one process, whatever
    the split. Only the last micro-batch all-reduces gradients (DistributedDataParallel).
    """
    local_tokens = sum(b.target_tokens for b in batches)
    global_tokens = distributed.all_sum([local_tokens], context)[0]
    # DDP averages gradients over processes; multiplying by world_size turns that into the sum.
    scale = context.world_size / global_tokens
    stats = StepStats(target_tokens=local_tokens)
    sums = []  # (2,) loss and NLL per micro-batch
    for i, batch in enumerate(batches):
        select, target = batch.real_targets()  # (N,) each, found on the host
        stats.padded_tokens += batch.padded_tokens
        stats.real_tokens += batch.real_tokens
        batch = batch.to(context.device)
        select, target = to_device(select, context.device), to_device(target, context.device)
        last = i == len(batches) - 1
        sync = contextlib.nullcontext() if last or not hasattr(objective, "no_sync") else objective.no_sync()
        with sync:
            with autocast or contextlib.nullcontext():
                loss, nll = objective(batch.src, batch.tgt_in, select, target)  # logits at real positions only
            scaled = loss * scale
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        sums.append(torch.stack([loss.detach(), nll.detach()]))
    stats.loss, stats.nll = torch.stack(sums).sum(0).float().unbind()  # still on the device: not read here
    return stats


def apply_update(model: nn.Module, optimizer, scheduler, scaler, clip_norm: float) -> torch.Tensor:
    """The optimizer step after train_step: unscale (fp16), clip, step, advance the schedule,
    all without making the host wait for the device (on a GPU each wait idles it while the
    host then queues the next update: a quarter to a third of big's step time).

    Returns the gradient norm, a device scalar for the loop to read later (QueuedUpdate).
    Where it is not finite (a non-finite loss gives non-finite gradients), the update is
    dropped on the device: the fused optimizer's found_inf leaves weights, moments and step
    count as they were; fp16's loss scale then backs off. The schedule has advanced
    regardless; the loop takes that back (unstep) once it reads the norm. The gradients are
    all-reduced, so every process reaches the same verdict."""
    if scaler is not None:
        scaler.unscale_(optimizer)  # also records, for scaler.update(), whether gradients overflowed
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), clip_norm if clip_norm > 0 else math.inf)
    # The norm, not only the gradients, decides: it can overflow where every gradient is finite.
    if optimizer.param_groups[0].get("fused"):
        optimizer.found_inf = (~torch.isfinite(grad_norm)).float()  # read by the fused kernel, on the device
        optimizer.step()
        del optimizer.found_inf
    elif torch.isfinite(grad_norm):  # an optimizer without found_inf: the host must look
        optimizer.step()
    if scaler is not None:
        scaler.update()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm.detach()


def unstep(scheduler) -> None:
    """Take back the scheduler.step() of a dropped update: the next update queued gets the
    learning rate the dropped one had. (The loop learns of a drop one update late, so the
    update queued in between runs one schedule step ahead: a relative difference of at most
    1 / warmup_steps, once per dropped update.)"""
    scheduler.last_epoch -= 1
    lrs = [base * scheduler.lr_lambdas[i](scheduler.last_epoch) for i, base in enumerate(scheduler.base_lrs)]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs):
        group["lr"] = lr
    scheduler._last_lr = lrs


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
        every = cfg.checkpoint.every_steps  # 0: by time only
        return bool(every) and n % every == 0 or (minutes is not None and time.monotonic() - last_saved >= 60 * minutes)

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
