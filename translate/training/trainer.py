"""The Trainer: one training run as a recipe (set-up, train, clean-up), built from named parts:
what an update changes (Learner), what it reads (Feed), the dev metrics (Validator), the log
and record (Monitor). Teacher forcing, label-smoothed cross-entropy, Adam with the paper's
warmup (section 5). The `translate train` verb (translate/verbs/train.py) runs it.

Knows nothing of Hydra: takes the typed TranslateConfig.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Deque, List, Optional

import numpy as np
import torch
from torch import nn

from translate.checkpoint import Checkpoint, prune
from translate.core import paths, run_record
from translate.core.choices import Positions
from translate.core.config import ModelConfig, TranslateConfig, to_plain
from translate.core.errors import Interrupted, TranslateError
from translate.core.host_memory import keep_compiled_products, keep_freed_memory
from translate.core.precision import MixedPrecision
from translate.data.batching import Batch, BatchStream, collate
from translate.data.cache import PreparedData
from translate.data.preparation import prepare, write_report
from translate.model import Transformer
from translate.training import distributed, resume
from translate.training.flops import Accounting
from translate.training.loss import LabelSmoothedObjective
from translate.training.checkpoint_writer import CheckpointWriter
from translate.training.monitor import Monitor, record_parts
from translate.training.optim import Adam, build_optimizer
from translate.training.schedule import LearningRateSchedule
from translate.training.stop_signals import StopSignals
from translate.training.time_limit import TimeLimit
from translate.training.update import QueuedUpdate, StepStats, apply_update, batch_plan, train_step
from translate.training.validate import Validator

log = logging.getLogger(__name__)
package_log = logging.getLogger("translate")  # every module's logger is below it


def _every(n: int, period: int) -> bool:
    """Whether something done every `period` updates (0: never) is due after update n."""
    return bool(period) and n % period == 0


@dataclass
class LoopState:
    """The loop's counts and clocks."""

    updates: int  # updates counted, over every run of this run_dir
    skipped: int  # non-finite updates dropped, likewise
    time_limit: TimeLimit  # train.max_minutes: the deadline, the pace, the projected end
    nonfinite_in_a_row: int = 0
    grad_norm: float = 0.0  # of the last update counted
    lr: float = 0.0
    saved_at: Optional[int] = None  # the update of the last checkpoint this run wrote
    last_saved: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class Learner:
    """What each update changes, and how: the model (its settings completed), its label-smoothed
    loss (the objective, maybe in DistributedDataParallel and compiled), Adam at the schedule's
    rate, and the mixed precision of the forward pass."""

    model: Transformer
    model_cfg: ModelConfig  # cfg.model completed: vocabulary size, learned positions' rows
    objective: nn.Module
    optimizer: Adam
    schedule: LearningRateSchedule
    precision: MixedPrecision


@dataclass(eq=False)
class Feed:
    """What each update reads: the prepared corpus and this process's batches of it."""

    data: PreparedData
    batches: BatchStream  # this process's share of every epoch, its position saved for resuming
    accumulation: int  # micro-batches per process per update
    epochs: int = 0  # epochs this process's stream had served whole after the last update
    ended_epoch: bool = False  # whether the last update's batches ended an epoch (of this process's stream)

    def __post_init__(self) -> None:
        self.epochs = self.batches.completed_epochs

    def next_update(self) -> List[Batch]:
        """This process's micro-batches of the next update."""
        specials = self.data.vocabulary.specials
        batches = []
        for _ in range(self.accumulation):
            indices = next(self.batches)  # the stream's epoch is now this batch's
            batches.append(collate(self.data.training_split(self.batches.epoch), indices, specials))
        completed = self.batches.completed_epochs
        self.ended_epoch, self.epochs = completed > self.epochs, completed
        return batches


@dataclass(eq=False)
class Trainer:
    """One training run, built by setup() from its parts, and the loop.

    Updates are read one behind: an update's gradient norm and loss sums are read once the
    next update is queued, so the device always has work while the host waits for them. At a
    boundary (log, checkpoint, validation, the last update) the update is read at once.
    """

    cfg: TranslateConfig
    context: distributed.Context
    learner: Learner
    feed: Feed
    validator: Validator  # dev metrics, the best so far (checkpoint_best.pt), early stopping
    state: LoopState
    monitor: Monitor
    stop_signals: StopSignals
    queued: Deque[QueuedUpdate] = field(default_factory=deque)  # on their way to the host, oldest first
    writer: CheckpointWriter = field(default_factory=lambda: CheckpointWriter(background=False))

    @classmethod
    def setup(cls, cfg: TranslateConfig, context: distributed.Context, command: str = "translate train") -> "Trainer":
        """Data, model, optimizer and schedule, restored from checkpoint_last.pt where there is one
        (else from train.init_from's weights, if set), then what the loop needs; `command` trains it."""
        _configure_process(cfg, context)
        run_dir = Path(cfg.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        data = prepare(cfg.data, log=log.info)  # one process prepares, the others wait for it
        if context.is_main:
            write_report(data, paths.data_report(run_dir))
        model_cfg = _model_config(cfg, data)
        model = Transformer(model_cfg, pad_id=data.vocabulary.specials.pad, init=cfg.train.init).to(context.device)
        optimizer, schedule = build_optimizer(model, cfg.optim, d_model=model_cfg.d_model, last_update=cfg.train.max_steps,
                                              device=context.device)
        precision = MixedPrecision.on(cfg.train.precision, context.device)
        tokens_per_batch, accumulation = batch_plan(cfg.train.tokens_per_update, cfg.train.tokens_per_batch,
                                                    context.world_size)
        batches = BatchStream(data.training_lengths(), tokens_per_batch, cfg.train.seed,
                              context.rank, context.world_size)
        validator = Validator(cfg, data, context)
        resumed = resume.start(cfg, data, model, model_cfg, optimizer=optimizer, schedule=schedule, precision=precision)
        # What only the loop needs, in this order: dropout's seed, then the peak measurement
        # (its random matrices from a generator of its own), then the restored random state of
        # a resumed run.
        torch.manual_seed(cfg.train.seed + 1000 * context.rank)  # dropout differs between processes
        log.info(f"model: {model.num_parameters():,} parameters ({model_cfg.layers}+{model_cfg.layers} layers, "
                 f"d_model {model_cfg.d_model}, d_ff {model_cfg.d_ff}, {model_cfg.heads} heads, vocabulary "
                 f"{model_cfg.vocab_size:,}); {len(data.train):,} training pairs; {tokens_per_batch} tokens per batch x "
                 f"{accumulation} accumulation x {context.world_size} processes; {precision.precision} on "
                 f"{context.device}; {torch.get_num_threads()} threads")
        accounting = _accounting(model_cfg, data, context, precision, passes=2 if cfg.train.rdrop > 0 else 1)
        learner = Learner(model, model_cfg, _objective(model, cfg, context), optimizer, schedule, precision)
        if resumed is not None:
            resume.restore_process_state(resumed, context, batches, validator.tracker)
        validator.load_dev_sentences()
        updates = int(resumed.step) if resumed is not None else 0
        previous = run_record.previous_training(run_dir, updates if resumed is not None else None)
        state = LoopState(updates, int(resumed.skipped_updates or 0) if resumed is not None else 0,
                          time_limit=TimeLimit(cfg.train.max_minutes, first_update=updates))
        monitor = Monitor(cfg, context, accounting, record=record_parts(cfg, data, model, model_cfg, command), previous=previous,
                          time_limit=state.time_limit, precision=str(precision.precision))
        # cleanup() closes the monitor; the stop signals are the caller's to close (train.train).
        return cls(cfg=cfg, context=context, learner=learner, feed=Feed(data, batches, accumulation), validator=validator,
                   state=state, monitor=monitor, stop_signals=StopSignals(),
                   writer=CheckpointWriter(background=cfg.checkpoint.background, activity=context.activity))

    @property
    def last_path(self) -> Path:
        return Path(self.cfg.run_dir) / paths.LAST_CHECKPOINT

    def train(self) -> Path:
        """Section 5 of the paper, one update at a time, then the boundaries; to
        train.max_steps, the time limit, a stop signal or early stopping."""
        cfg, state = self.cfg, self.state
        if state.updates >= self.learner.schedule.last_update:
            log.info(f"{self.last_path} already has {state.updates} updates (its last: "
                     f"{self.learner.schedule.last_update}): nothing to do")
            return self.last_path
        learner = self.learner
        learner.model.train()
        while state.updates < self.learner.schedule.last_update and not self.between_updates():
            batches = self.feed.next_update()  # about 25k source and 25k target tokens (5.1)
            self.context.activity.doing(f"update {state.updates + 1}: forward and backward")
            stats = train_step(learner.objective, batches, self.context, learner.precision.autocast,
                               learner.precision.scaler)  # teacher forcing, label-smoothed loss (5.4), backward
            self.context.activity.doing(f"update {state.updates + 1}: the optimizer step")
            grad_norm, lr = apply_update(learner.model, learner.optimizer, learner.schedule, learner.precision.scaler,
                                         cfg.optim.clip_norm)  # Adam at the schedule's rate (5.3)
            self.queued.append(QueuedUpdate(stats, grad_norm, lr))
            self.settle(keep=1)  # the previous update, while the device works on this one
            if not self.boundary(state.updates + 1) or not self.settle():
                continue
            if state.time_limit.projects(learner.schedule, state.updates):  # where the warmup or a linear decay ends
                state.time_limit.project(learner.schedule, state.updates, self.context)
            if _every(state.updates, cfg.train.log_every) or state.updates == learner.schedule.last_update:
                self.monitor.log(state.updates, state.lr, state.grad_norm, state.skipped)
            # Validate before saving, so that the checkpoint holds this validation's result.
            if self.validator.due(state.updates) and self.validate():
                break  # early stopping: validate() has saved
            self.writer.poll()  # a background write that has ended: its run record
            if self.save_due():
                self.save()
        self.settle()
        if state.saved_at != state.updates:  # early stopping, say, has just saved
            self.save(numbered=not cfg.checkpoint.by_epochs_alone)  # epochs alone: checkpoint_last.pt
        self.writer.wait()  # the last checkpoint is on disk before the run says it ended
        self.monitor.report(state.updates, self.last_path)
        return self.last_path

    def cleanup(self) -> None:
        """Undo what set-up opened in the process, however the run ended (TensorBoard's writer
        flushes to disk: at most a minute). The stop signals stay caught: the caller closes them
        once the process group is gone. A checkpoint still being written is finished first."""
        self.writer.close()
        distributed.within(60.0, "closing the log and TensorBoard's writer", self.monitor.close)

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
        state = self.state
        state.updates, state.nonfinite_in_a_row, state.grad_norm, state.lr = state.updates + 1, 0, norm, lr
        stats.loss, stats.nll = loss, nll
        state.time_limit.count(state.updates)
        self.monitor.count(stats, state.updates)

    def _drop(self) -> None:
        """A non-finite update, dropped on the device (weights, optimizer and schedule untouched)."""
        state = self.state
        state.skipped += 1
        state.nonfinite_in_a_row += 1
        log.warning(f"update {state.updates + 1}: non-finite loss or gradient, skipped ({state.skipped} so far)")
        if state.nonfinite_in_a_row >= self.cfg.train.max_nonfinite:
            good = self.last_path if self.last_path.is_file() else "none yet"
            raise TranslateError(f"{state.nonfinite_in_a_row} non-finite updates in a row at update "
                                 f"{state.updates + 1}: stopping; last good checkpoint: {good}")

    def boundary(self, n: int) -> bool:
        """Whether something happens after update n (so that it must be read at once)."""
        cfg, schedule = self.cfg, self.learner.schedule
        return (n >= schedule.last_update or _every(n, cfg.train.log_every) or _every(n, cfg.valid.every_steps)
                or self.save_due(n) or self.state.time_limit.projects(schedule, n))

    # The boundaries.

    def save_due(self, n: Optional[int] = None) -> bool:
        """Whether a checkpoint is due after update n (default: the last one counted)."""
        minutes = self.cfg.checkpoint.every_minutes
        n = self.state.updates if n is None else n
        return _every(n, self.cfg.checkpoint.every_steps) or (
            minutes is not None and time.monotonic() - self.state.last_saved >= 60 * minutes)

    def decodable(self) -> Checkpoint:
        """What every checkpoint holds (a numbered one nothing else): what decoding needs."""
        languages = [self.cfg.data.src_lang, self.cfg.data.tgt_lang]
        return Checkpoint.of_model(self.learner.model, self.learner.model_cfg, self.feed.data.vocabulary, languages,
                                   self.state.updates, lowercase=self.cfg.data.lowercase)

    def save(self, numbered: bool = True) -> None:
        """checkpoint_last.pt (full state, for resuming exactly: every process's random state
        and data position too) and, if `numbered`, a numbered copy of the weights (for
        averaging); numbered ones beyond checkpoint.keep_last are deleted. Then the run record.
        With checkpoint.background the files are written by self.writer while training goes on."""
        self.settle()  # the weights hold every queued update: count them all
        state, run_dir = self.state, Path(self.cfg.run_dir)
        self.context.activity.doing(f"saving the checkpoint of update {state.updates}")
        state.last_saved, state.saved_at = time.monotonic(), state.updates
        states = resume.gather_process_states(self.context, self.feed.batches)
        if not self.context.is_main:
            return
        weights, learner, scaler = self.decodable(), self.learner, self.learner.precision.scaler
        last = replace(weights, optimizer=learner.optimizer.state_dict(), scheduler=learner.schedule.state_dict(),
                       config=to_plain(self.cfg), processes=states, valid=self.validator.tracker.state_dict(),
                       skipped_updates=state.skipped, scaler=scaler.state_dict() if scaler is not None else None)
        files = [(self.last_path, last.payload())]
        if numbered:  # and a copy of the weights alone, for averaging
            files.append((paths.numbered_checkpoint(run_dir, state.updates), weights.payload()))
        keep, updates, skipped = self.cfg.checkpoint.keep_last, state.updates, state.skipped
        self.writer.save(files, after_files=(lambda: prune(run_dir, keep)) if numbered else None,
                         after=lambda: self.monitor.record(updates, skipped), what=f"the checkpoint of update {updates}")

    def validate(self) -> bool:
        """Dev metrics on the main process, checkpoint_best.pt kept by valid.metric; returns
        whether to stop (valid.patience, train.target_bleu), agreed by all processes. Saves
        before stopping."""
        why, updates = None, self.state.updates
        self.context.activity.doing(f"validating after update {updates}" if self.context.is_main
                                    else f"waiting for rank 0's validation after update {updates}")
        if self.context.is_main:
            result = self.validator.run(self.learner.model, updates)
            self.monitor.dev(updates, result, self.validator.dev, self.validator.tracker.best)
            if result.reached:
                self.monitor.reached(updates, result.metrics["bleu"], self.cfg.train.target_bleu)
            if self.last_path.is_file():
                self.monitor.record(updates, self.state.skipped)
            if result.improved:
                replace(self.decodable(), dev=result.metrics).save(Path(self.cfg.run_dir) / paths.BEST_CHECKPOINT)
            why = result.stop
        why = distributed.from_main(why, self.context)
        if why is None:
            return False
        self.save()
        log.info(why)
        return True

    def between_updates(self) -> bool:
        """What every process agrees on between two updates, so that none waits for the others:
        a stop signal (save, then raise), the end of an epoch on the main process's stream (its
        checkpoint, checkpoint.every_epochs), train.max_minutes (returns True: stop)."""
        received = self.stop_signals.received
        self.context.activity.doing(f"agreeing with the others after update {self.state.updates}")
        main = self.context.is_main  # the main process's stream decides: the shards of an epoch may differ by a batch
        ended, epochs = (float(self.feed.ended_epoch), float(self.feed.epochs)) if main else (0.0, 0.0)
        seen = [float(received is not None), float(self.state.time_limit.reached()), ended, epochs]
        signal_seen, time_up, epoch_ended, epochs = distributed.all_sum(seen, self.context)
        if signal_seen:
            self.save(numbered=not self.cfg.checkpoint.by_epochs_alone)
            self.writer.wait()  # on disk before the line below says so
            stopped = Interrupted if received == signal.SIGINT else TranslateError
            raise stopped(f"stopped by {self.stop_signals.name or 'a stop signal on another process'} at update "
                          f"{self.state.updates}: saved {self.last_path}; {self.stop_signals.how_to_resume()}")
        every = self.cfg.checkpoint.every_epochs
        if epoch_ended and every and int(epochs) % every == 0 and self.state.saved_at != self.state.updates:
            self.save()  # the weights after the epoch's last update
            log.info(f"epoch {int(epochs)} ended at update {self.state.updates}: checkpoint saved")
        if time_up:
            self.settle()
        return bool(time_up)


def _configure_process(cfg: TranslateConfig, context: distributed.Context) -> None:
    """Threads, host memory, log level, and the seed of the initial weights (the same on
    every process)."""
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    if context.device.type == "cpu":
        keep_freed_memory()  # each update's large blocks reused, not faulted in afresh
        keep_compiled_products()  # each batch shape's bf16 products compiled once, not once an epoch
    if not context.is_main:
        package_log.setLevel(logging.WARNING)
    torch.manual_seed(cfg.train.seed)


def _model_config(cfg: TranslateConfig, data: PreparedData) -> ModelConfig:
    """cfg.model with the vocabulary's size; learned positions serve what decode serves
    (decode.max_source_length and its output cap)."""
    learned = cfg.model.positions == Positions.learned
    rows = (cfg.model.max_positions or cfg.decode.positions()) if learned else 0
    return replace(cfg.model, vocab_size=len(data.vocabulary), max_positions=rows)


def _accounting(model_cfg: ModelConfig, data: PreparedData, context: distributed.Context,
                precision: MixedPrecision, passes: int = 1) -> Accounting:
    """FLOPs per target token at the corpus's average lengths (EOS included) and the peak;
    `passes` times a pass's (R-Drop runs each batch twice)."""
    split = data.training_split(0)  # a sampled segmentation, under BPE-dropout: not every copy's lengths
    lengths = float(np.mean(split.src_lengths)) + 1, float(np.mean(split.tgt_lengths)) + 1
    accounting = Accounting.measure(model_cfg, *lengths, context.device, precision.peak_dtype(), context.world_size,
                                    context.is_main)
    accounting.flops_per_token *= passes
    log.info(f"{accounting.flops_per_token / 1e9:.3f} GFLOP per target token; device {accounting.peak_label()}")
    return accounting


def _objective(model: nn.Module, cfg: TranslateConfig, context: distributed.Context) -> nn.Module:
    """The label-smoothed loss of the model, wrapped for DistributedDataParallel and the compiler."""
    objective: nn.Module = LabelSmoothedObjective(model, cfg.train.label_smoothing, cfg.train.rdrop)
    if context.distributed:
        device_ids = [context.device] if context.device.type == "cuda" else None
        objective = nn.parallel.DistributedDataParallel(objective, device_ids=device_ids)
    if cfg.train.compile:
        # After DDP, so that the compiler splits the graph at DDP's gradient buckets and their
        # all-reduce still overlaps the backward pass (one compiled backward would hold every
        # gradient back to its end). Dynamic: batch shapes vary with the length bucket.
        objective = torch.compile(objective, dynamic=True)
    return objective
