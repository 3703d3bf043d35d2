"""The `translate train` verb: teacher forcing, label-smoothed cross-entropy, Adam with warmup
(paper, section 5), as a Trainer: its set-up, its loop, and one method per boundary (log,
checkpoint, validate, stop).

Knows nothing of Hydra: takes the typed TranslateConfig.
"""

from __future__ import annotations

import logging
import math
import signal
import sys
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any, Deque, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from translate import checkpoint, paths
from translate.training import distributed, resume, run_record
from translate.config import Positions, TranslateConfig, to_plain
from translate.data.batching import Batch, BatchStream, collate
from translate.data.cache import prepare, write_report
from translate.errors import Interrupted, TranslateError
from translate.training.flops import Accounting
from translate.training.host_memory import keep_freed_memory
from translate.training.loss import LabelSmoothedObjective
from translate.model import Transformer
from translate.training.optim import build_optimizer
from translate.training.precision import MixedPrecision
from translate.training.run_lock import RunLock
from translate.training.update import QueuedUpdate, StepStats, apply_update, batch_plan, train_step
from translate.training.validate import Tracker, dev_sentences, evaluate

log = logging.getLogger(__name__)
package_log = logging.getLogger("translate")  # every module's logger is below it


def train(cfg: TranslateConfig) -> Path:
    """Train until train.max_steps updates or train.max_minutes; returns the last checkpoint.

    Under torchrun every process trains its share of each update (DistributedDataParallel);
    only the main process logs and writes checkpoints, and holds run_dir's lock for the job.
    """
    context = distributed.init()
    # What a run changes in the process comes back afterwards, so that the next job of a
    # multirun sweep (run one after another in this process) starts clean.
    threads, level = torch.get_num_threads(), package_log.level
    lock = RunLock(Path(cfg.run_dir))
    try:
        _own(lock, context)
        return Trainer(cfg, context).run()
    finally:
        lock.release()
        distributed.shutdown()
        torch.set_num_threads(threads)
        package_log.setLevel(level)


def _own(lock: RunLock, context: distributed.Context) -> None:
    """The main process takes run_dir's lock for the whole job; if another training holds it,
    every process of this job stops with the holder's name, before anything is written."""
    problem = None
    if context.is_main:
        try:
            lock.acquire()
        except TranslateError as error:
            problem = str(error)
    problem = distributed.from_main(problem, context)
    if problem:
        raise TranslateError(problem)


def _every(n: int, period: int) -> bool:
    """Whether something done every `period` updates (0: never) is due after update n."""
    return bool(period) and n % period == 0


class Trainer:
    """One training run: the model, its optimizer and data, and the counts of the loop.

    Updates are read one behind: an update's gradient norm and loss sums are read once the
    next update is queued, so the device always has work while the host waits for them. At a
    boundary (log, checkpoint, validation, the last update) the update is read at once.
    """

    def __init__(self, cfg: TranslateConfig, context: distributed.Context):
        self.cfg, self.context = cfg, context
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        if context.device.type == "cpu":
            keep_freed_memory()  # each update's large blocks reused, not faulted in afresh
        if not context.is_main:
            package_log.setLevel(logging.WARNING)
        torch.manual_seed(cfg.train.seed)  # the same initial weights on every process
        self.run_dir = Path(cfg.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.last_path = self.run_dir / paths.LAST_CHECKPOINT
        self.data = prepare(cfg.data, log=log.info)  # one process prepares, the others wait for it
        if context.is_main:
            write_report(self.data, self.run_dir / "data_report.json")
        # Learned positions serve what decode serves (decode.max_source_length and its output cap).
        learned = cfg.model.positions == Positions.learned
        self.model_cfg = replace(cfg.model, vocab_size=len(self.data.vocabulary),
                                 max_positions=(cfg.model.max_positions or cfg.decode.positions()) if learned else 0)
        self.model = Transformer(self.model_cfg, pad_id=self.data.vocabulary.specials.pad).to(context.device)
        self.optimizer, self.schedule = build_optimizer(self.model, cfg.optim, self.model_cfg.d_model,
                                                        cfg.train.max_steps, context.device)
        self.precision = MixedPrecision.on(cfg.train.precision, context.device)
        self.tokens_per_batch, self.accumulation = batch_plan(cfg.train.tokens_per_update, cfg.train.tokens_per_batch,
                                                              context.world_size)
        self.batches = BatchStream(self.data.train.src_lengths, self.data.train.tgt_lengths, self.tokens_per_batch,
                                   cfg.train.seed, context.rank, context.world_size)
        self.tracker = Tracker(cfg.valid.metric)
        self.step = self.skipped = self.nonfinite_in_a_row = 0  # updates counted, dropped; dropped in a row
        self.resumed = self._start()
        # Training time and compute of the runs this one resumes (the run record sums them).
        self.previous = run_record.previous_training(self.run_dir, self.step if self.resumed is not None else None)
        self.last_valid: Optional[Dict[str, float]] = None  # the last validation's metrics
        # Set by _prepare_loop, once the run is known to train.
        self.objective: Optional[nn.Module] = None  # the model's label-smoothed loss, maybe in DDP and compiled
        self.accounting: Optional[Accounting] = None
        self.dev: Optional[Tuple[List[str], List[str]]] = None  # dev sentences for BLEU
        # The loop's state.
        self.queued: Deque[QueuedUpdate] = deque()  # updates on their way to the host, oldest first
        self.window, self.totals = StepStats(), StepStats()  # since the last log line; this whole run
        self.last_norm = self.last_lr = 0.0  # of the last update counted
        self.started = self.window_start = self.last_saved = time.monotonic()
        self.first_step = self.step  # where this run's loop began
        self.deadline = math.inf  # of train.max_minutes
        self.saved_at: Optional[int] = None  # the update of the last checkpoint this run wrote
        self.writer = self.progress = self.stop_signal = None  # main process: TensorBoard, tqdm; signal handlers

    def _start(self) -> Optional[Dict[str, Any]]:
        """Resume from checkpoint_last.pt where there is one, else start (from train.init_from's
        weights, if set); returns the resumed payload."""
        cfg = self.cfg
        resumed = resume.load_training_state(self.last_path, self.model, self.model_cfg, self.data.vocabulary, cfg.optim,
                                             self.optimizer, self.schedule, self.precision.scaler)
        if resumed is not None:
            self.step, self.skipped = int(resumed["step"]), int(resumed.get("skipped_updates", 0))
            log.info(f"resuming from {self.last_path} at update {self.step}")
        elif cfg.train.init_from:
            resume.load_weights(Path(cfg.train.init_from), self.model, self.model_cfg, self.data.vocabulary)
            log.info(f"starting from the weights of {cfg.train.init_from} (fresh optimizer and schedule)")
        return resumed

    def _prepare_loop(self) -> None:
        """What only a run that trains needs: the objective (wrapped for DDP and the
        compiler), the processes' random states, dev sentences, compute accounting."""
        cfg, context, model_cfg = self.cfg, self.context, self.model_cfg
        torch.manual_seed(cfg.train.seed + 1000 * context.rank)  # dropout differs between processes
        log.info(
            f"model: {self.model.num_parameters():,} parameters ({model_cfg.layers}+{model_cfg.layers} layers, "
            f"d_model {model_cfg.d_model}, d_ff {model_cfg.d_ff}, {model_cfg.heads} heads, vocabulary "
            f"{model_cfg.vocab_size:,}); {len(self.data.train):,} training pairs; {self.tokens_per_batch} tokens per "
            f"batch x {self.accumulation} accumulation x {context.world_size} processes; {self.precision.precision} on "
            f"{context.device}; {torch.get_num_threads()} threads"
        )
        lengths = float(np.mean(self.data.train.src_lengths)) + 1, float(np.mean(self.data.train.tgt_lengths)) + 1
        self.accounting = Accounting.measure(model_cfg, *lengths, context.device, self.precision.peak_dtype(),
                                             context.world_size, context.is_main)
        log.info(f"{self.accounting.flops_per_token / 1e9:.3f} GFLOP per target token; device peak "
                 f"{self.accounting.peak_flops / 1e12:.2f} TFLOP/s ({self.precision.precision})")
        self.objective = LabelSmoothedObjective(self.model, cfg.train.label_smoothing)
        if context.distributed:
            device_ids = [context.device] if context.device.type == "cuda" else None
            self.objective = nn.parallel.DistributedDataParallel(self.objective, device_ids=device_ids)
        if cfg.train.compile:
            # After DDP, so that the compiler splits the graph at DDP's gradient buckets and their
            # all-reduce still overlaps the backward pass (one compiled backward would hold every
            # gradient back to its end). Dynamic: batch shapes vary with the length bucket.
            self.objective = torch.compile(self.objective, dynamic=True)
        if self.resumed is not None:  # after the peak measurement, which draws random numbers
            resume.restore_process_state(self.resumed, context, self.batches, self.tracker)
        wants_bleu = context.is_main and cfg.valid.every_steps and cfg.valid.bleu_sentences
        self.dev = dev_sentences(cfg) if wants_bleu else None

    def run(self) -> Path:
        """Train to train.max_steps (or the time limit, a stop signal, early stopping)."""
        if self.step >= self.cfg.train.max_steps:
            log.info(f"{self.last_path} already has {self.step} updates (train.max_steps={self.cfg.train.max_steps}): "
                     "nothing to do")
            return self.last_path
        self._prepare_loop()
        self.model.train()
        self.started = self.window_start = self.last_saved = time.monotonic()
        self.first_step = self.step
        minutes = self.cfg.train.max_minutes
        self.deadline = self.started + 60 * minutes if minutes else math.inf
        # The writer, the progress bar and the signal handlers are undone however the loop ends.
        try:
            self.writer = self._summary_writer() if self.context.is_main else None
            self.progress = _progress(self.cfg.train.max_steps, self.step) if self.context.is_main else None
            self.stop_signal = resume.StopSignals()
            self._loop()
        finally:
            for resource in (self.stop_signal, self.progress, self.writer):
                if resource is not None:
                    resource.close()
        self.settle()
        if self.saved_at != self.step:  # early stopping, say, has just saved
            self.save()
        self._report()
        return self.last_path

    def _loop(self) -> None:
        """Section 5 of the paper, one update at a time, then the boundaries."""
        cfg = self.cfg
        while self.step < cfg.train.max_steps and not self.stop():
            batches = self.next_batches()  # about 25k source and 25k target tokens (5.1)
            stats = train_step(self.objective, batches, self.context, self.precision.autocast,
                               self.precision.scaler)  # teacher forcing, label-smoothed loss (5.4), backward
            grad_norm, lr = apply_update(self.model, self.optimizer, self.schedule, self.precision.scaler,
                                         cfg.optim.clip_norm)  # Adam at the schedule's rate (5.3)
            self.queued.append(QueuedUpdate(stats, grad_norm, lr))
            self.settle(keep=1)  # the previous update, while the device works on this one
            if not self.boundary(self.step + 1) or not self.settle():
                continue
            if _every(self.step, cfg.train.log_every) or self.step == cfg.train.max_steps:
                self.log()
            if self.save_due():
                self.save()
            if _every(self.step, cfg.valid.every_steps) and self.data.valid is not None and self.validate():
                break

    def next_batches(self) -> List[Batch]:
        """This process's micro-batches of the next update."""
        specials = self.data.vocabulary.specials
        return [collate(self.data.train, next(self.batches), specials) for _ in range(self.accumulation)]

    def settle(self, keep: int = 0) -> bool:
        """Read the queued updates but the newest `keep`: count each, or count it as dropped.
        Returns whether any counted."""
        counted = False
        while len(self.queued) > keep:
            norm, loss, nll, lr = self.queued[0].read()  # interrupted here, the queue is as it was
            update = self.queued.popleft()
            if math.isfinite(norm):
                self._count(update.stats, loss, nll, norm, lr)
                counted = True
            else:
                self._drop()
        return counted

    def _count(self, stats: StepStats, loss: float, nll: float, norm: float, lr: float) -> None:
        self.nonfinite_in_a_row = 0
        self.step += 1
        self.last_norm, self.last_lr = norm, lr
        stats.loss, stats.nll = loss, nll
        self.window.add(stats)
        self.totals.add(stats)
        if self.progress is not None:
            self.progress.total = bar_total(self.step, self.first_step, self.cfg.train.max_steps,
                                            time.monotonic() - self.started, self.deadline - time.monotonic())
            self.progress.update(1)

    def _drop(self) -> None:
        """A non-finite update, dropped on the device (weights, optimizer and schedule untouched)."""
        self.skipped += 1
        self.nonfinite_in_a_row += 1
        log.warning(f"update {self.step + 1}: non-finite loss or gradient, skipped ({self.skipped} so far)")
        if self.nonfinite_in_a_row >= self.cfg.train.max_nonfinite:
            good = self.last_path if self.last_path.is_file() else "none yet"
            raise TranslateError(f"{self.nonfinite_in_a_row} non-finite updates in a row at update {self.step + 1}: "
                                 f"stopping; last good checkpoint: {good}")

    def boundary(self, n: int) -> bool:
        """Whether something happens after update n (so that it must be read at once)."""
        cfg = self.cfg
        return (n >= cfg.train.max_steps or _every(n, cfg.train.log_every) or _every(n, cfg.valid.every_steps)
                or self.save_due(n))

    # The boundaries.

    def log(self) -> None:
        """TensorBoard scalars and one log line for the updates since the last report."""
        window = self.window.summed(self.context)
        seconds = time.monotonic() - self.window_start
        self.window, self.window_start = StepStats(), time.monotonic()
        if not self.context.is_main:
            return
        nll = window.nll / window.target_tokens
        metrics = {"loss": window.loss / window.target_tokens, "nll": nll, "ppl": math.exp(min(nll, 50)),
                   "lr": self.last_lr, "padding": window.padding, "grad_norm": self.last_norm,
                   "skipped_updates": self.skipped, **self.accounting.window(window.target_tokens, seconds)}
        for name, value in metrics.items():
            self.writer.add_scalar(f"train/{name}", value, self.step)
        share = metrics.get("paper_compute_share")
        log.info(
            f"update {self.step}: loss {metrics['loss']:.3f} nll {nll:.3f} ppl {metrics['ppl']:.1f} "
            f"lr {self.last_lr:.2e} {metrics['target_tokens_per_s']:.0f} tgt tok/s padding {window.padding:.1%} "
            f"mfu {metrics['mfu']:.0%} mem {metrics['peak_memory_gb']:.1f} GB compute {metrics['model_flops']:.2e} FLOPs"
            + (f" ({share:.2%} of the paper's)" if share is not None else "")
        )

    def save_due(self, n: Optional[int] = None) -> bool:
        """Whether a checkpoint is due after update n (default: the last one counted)."""
        minutes = self.cfg.checkpoint.every_minutes
        n = self.step if n is None else n
        return _every(n, self.cfg.checkpoint.every_steps) or (
            minutes is not None and time.monotonic() - self.last_saved >= 60 * minutes)

    def weights(self) -> Dict[str, Any]:
        """The checkpoint payload every checkpoint holds: what decoding needs."""
        languages = [self.cfg.data.src_lang, self.cfg.data.tgt_lang]
        return checkpoint.weights(self.model, self.model_cfg, self.data.vocabulary, languages, self.step)

    def save(self) -> None:
        """checkpoint_last.pt (full state, for resuming exactly: every process's random state
        and data position too) and a numbered copy of the weights (for averaging); numbered
        ones beyond checkpoint.keep_last are deleted."""
        self.settle()  # the weights hold every queued update: count them all
        self.last_saved, self.saved_at = time.monotonic(), self.step
        states = resume.gather_process_states(self.context, self.batches)
        if not self.context.is_main:
            return
        weights = self.weights()
        payload = {**weights, "optimizer": self.optimizer.state_dict(), "scheduler": self.schedule.state_dict(),
                   "config": to_plain(self.cfg), "processes": states, "valid": self.tracker.state_dict(),
                   "skipped_updates": self.skipped}
        if self.precision.scaler is not None:
            payload["scaler"] = self.precision.scaler.state_dict()
        checkpoint.save(self.last_path, payload)
        checkpoint.save(paths.numbered_checkpoint(self.run_dir, self.step), weights)  # for averaging
        checkpoint.prune(self.run_dir, self.cfg.checkpoint.keep_last)
        self._record()

    def _record(self) -> None:
        """The run record's training part, as of the checkpoint just written."""
        report, data = self.data.report, self.cfg.data
        this_run = self.accounting.done if self.accounting is not None else 0.0
        run_record.record_training(
            self.run_dir, settings=to_plain(self.cfg),
            data={"source": data.path or data.train, "name": data.name, "languages": [data.src_lang, data.tgt_lang],
                  "train_pairs": report["train"]["pairs"], "train_pairs_kept": report["train"]["kept"],
                  "train_tokens": {"source": report["train"]["tokens_src"], "target": report["train"]["tokens_tgt"]},
                  "vocabulary": {"size": report["vocab_size"], "given": data.spm_model,
                                 "specials": self.data.vocabulary.specials.as_dict()}},
            model={"parameters": self.model.num_parameters(), **to_plain(self.model_cfg)},
            training={"updates": self.step, "seconds": self.previous["seconds"] + time.monotonic() - self.started,
                      "model_flops": self.previous["model_flops"] + this_run, "skipped_updates": self.skipped,
                      "device": str(self.context.device), "processes": self.context.world_size,
                      "precision": str(self.precision.precision)},
            valid=self.last_valid)

    def validate(self) -> bool:
        """Dev metrics on the main process, checkpoint_best.pt kept by valid.metric; returns
        whether to stop early (valid.patience), agreed by all processes. Saves before stopping."""
        stop = False
        if self.context.is_main:
            metrics, hypotheses = evaluate(self.model, self.data.valid, self.data.vocabulary, self.dev,
                                           self.cfg.train.tokens_per_batch, self.cfg.train.label_smoothing,
                                           self.context.device)
            self._write_dev(metrics, hypotheses)
            improved = self.tracker.update(metrics[self.cfg.valid.metric])
            self.last_valid = {"update": self.step, **metrics}
            if self.context.is_main and self.last_path.is_file():
                self._record()
            text = " ".join(f"{k} {v:.3f}" for k, v in metrics.items())
            log.info(f"update {self.step}: dev {text}" + (" (best)" if improved else f" (best {self.tracker.best:.3f})"))
            if improved:
                checkpoint.save(self.run_dir / paths.BEST_CHECKPOINT, {**self.weights(), "dev": metrics})
            stop = bool(self.cfg.valid.patience) and self.tracker.since_best >= self.cfg.valid.patience
        if not distributed.any_true(stop, self.context):
            return False
        self.save()
        log.info(f"early stopping at update {self.step}: no better {self.cfg.valid.metric} in "
                 f"{self.cfg.valid.patience} validations")
        return True

    def _write_dev(self, metrics: Dict[str, float], hypotheses: List[str]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(f"dev/{name}", value, self.step)
        if hypotheses:
            sources, references = self.dev
            shown = list(zip(sources, hypotheses, references))[:5]
            self.writer.add_text("dev/translations", "\n\n".join(f"{s}  \n→ {h}  \n(ref) {r}" for s, h, r in shown), self.step)

    def stop(self) -> bool:
        """True when time is up; a stop signal saves and raises. Agreed by all processes, so
        that none waits for the others."""
        seen = [float(self.stop_signal.received is not None), float(time.monotonic() >= self.deadline)]
        signal_seen, time_up = distributed.all_sum(seen, self.context)
        if signal_seen:
            self.save()
            stopped = Interrupted if self.stop_signal.received == signal.SIGINT else TranslateError
            raise stopped(f"stopped by {self.stop_signal.name or 'a stop signal on another process'} at update "
                          f"{self.step}: saved {self.last_path}; run the same command to resume")
        if time_up:
            self.settle()
        return bool(time_up)

    def _report(self) -> None:
        """The run's last log line: throughput, padding and loss over all its updates."""
        elapsed = time.monotonic() - self.started
        totals = self.totals.summed(self.context)
        if totals.target_tokens:
            log.info(
                f"stopped at update {self.step} after {elapsed / 60:.1f} min: {totals.target_tokens / elapsed:.0f} "
                f"target tokens/s, padding {totals.padding:.1%}, loss {totals.loss / totals.target_tokens:.3f}; "
                f"checkpoint {self.last_path}"
            )

    def _summary_writer(self):
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(str(self.run_dir / "tensorboard"))


def bar_total(step: int, first_step: int, max_steps: int, elapsed: float, remaining: float) -> int:
    """The progress bar's end: train.max_steps, or, where train.max_minutes comes first, the
    update the run will reach by then at its rate so far (step: updates now; first_step: when
    this run began; elapsed and remaining: seconds since then and up to the time limit)."""
    done = step - first_step
    if done < 1 or elapsed <= 0 or remaining == math.inf:
        return max_steps
    return min(max_steps, step + int(done / elapsed * max(remaining, 0.0)))


def _progress(total: int, initial: int):
    """A tqdm bar on an interactive terminal (log lines still go to the log file and console)."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="update", dynamic_ncols=True)
