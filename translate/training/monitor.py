"""What a training run reports: a log line and TensorBoard scalars every train.log_every updates,
a progress bar on a terminal, the dev metrics and translations, the run record at every
checkpoint and validation, and the run's last line.

Every process counts its updates here; the main process alone writes. Summing the counts over
processes is a collective, so every process calls log() and report() alike.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Tuple

from translate.core import paths, run_record
from translate.core.run_record import (Compute, DataFacts, ModelFacts, RunRecord, Target, TrainingTotals, TrainTokens,
                                       Validation, VocabularyFacts)
from translate.core.config import ModelConfig, TranslateConfig, to_plain
from translate.data.cache import PreparedData
from translate.model import Transformer
from translate.training import distributed
from translate.training.flops import Accounting
from translate.training.time_limit import TimeLimit
from translate.training.update import StepStats

if TYPE_CHECKING:
    from translate.training.validate import Validation

log = logging.getLogger(__name__)


class Monitor:
    """The run's log lines, TensorBoard, progress bar and run record.

    record: what the run record says of the run itself (settings, data, model, the command);
    previous: the training compute of the runs this one resumes, which the record adds to;
    time_limit: the run's, whose projected end the progress bar ends at."""

    def __init__(self, cfg: TranslateConfig, context: distributed.Context, accounting: Accounting, *,
                 record: RunRecord, previous: Compute, time_limit: TimeLimit, precision: str):
        self.cfg, self.context, self.accounting = cfg, context, accounting
        self.run_dir = Path(cfg.run_dir)
        self.record_parts, self.previous, self.precision = record, previous, precision
        self.started = self.window_start = time.monotonic()  # this run's start; the log window's
        self.time_limit = time_limit
        self.window, self.totals = StepStats(), StepStats()  # since the last log line; this whole run
        self.last_valid: Optional[Validation] = None  # the last validation's metrics
        self.target: Optional[Target] = None  # when train.target_bleu was reached
        self.writer = _summary_writer(paths.tensorboard(self.run_dir)) if context.is_main else None
        self.progress = _progress_bar(cfg.train.max_steps, time_limit.first_update) if context.is_main else None

    def count(self, stats: StepStats, updates: int) -> None:
        """One more update counted (updates: the count now); the bar's end follows the time limit."""
        self.window.add(stats)
        self.totals.add(stats)
        if self.progress is not None:
            self.progress.total = self.time_limit.projected_end(updates, last_update=self.cfg.train.max_steps)
            self.progress.update(1)

    def log(self, updates: int, lr: float, grad_norm: float, skipped: int) -> None:
        """TensorBoard scalars and one log line for the updates since the last one."""
        window = self.window.summed(self.context)
        seconds = time.monotonic() - self.window_start
        self.window, self.window_start = StepStats(), time.monotonic()
        if not self.context.is_main:
            return
        nll = window.nll / window.target_tokens
        metrics = {"loss": window.loss / window.target_tokens, "nll": nll, "ppl": math.exp(min(nll, 50)), "lr": lr,
                   "padding": window.padding, "grad_norm": grad_norm, "skipped_updates": skipped,
                   **self.accounting.window(window.target_tokens, seconds)}
        for name, value in metrics.items():
            self.writer.add_scalar(f"train/{name}", value, updates)
        share = metrics.get("paper_compute_share")
        log.info(
            f"update {updates}: loss {metrics['loss']:.3f} nll {nll:.3f} ppl {metrics['ppl']:.1f} "
            f"lr {lr:.2e} {metrics['target_tokens_per_s']:.0f} tgt tok/s padding {window.padding:.1%} "
            f"mfu {metrics['mfu']:.0%} of {self.accounting.peak_label()} "  # e.g. "of 0.42 TFLOP/s bf16 peak"
            f"mem {metrics['peak_memory_gb']:.1f} GB compute {metrics['model_flops']:.2e} FLOPs"
            + (f" ({share:.2%} of the paper's)" if share is not None else "")
        )

    def dev(self, updates: int, result: "Validation", dev: Optional[Tuple[List[str], List[str]]], best: float) -> None:
        """A validation's metrics (main process): TensorBoard, a few translations of the dev
        sentences `dev`, a log line."""
        metrics, hypotheses, improved = result.metrics, result.hypotheses, result.improved
        self.last_valid = Validation(update=updates, metrics=dict(metrics))
        for name, value in metrics.items():
            self.writer.add_scalar(f"dev/{name}", value, updates)
        if hypotheses:
            sources, references = dev
            shown = list(zip(sources, hypotheses, references))[:5]
            self.writer.add_text("dev/translations", "\n\n".join(f"{s}  \n→ {h}  \n(ref) {r}" for s, h, r in shown), updates)
        text = " ".join(f"{k} {v:.3f}" for k, v in metrics.items())
        log.info(f"update {updates}: dev {text}" + (" (best)" if improved else f" (best {best:.3f})"))

    def reached(self, updates: int, bleu: float, target: float) -> None:
        """train.target_bleu reached (main process): the time to it, as MLPerf counts it, from
        this process's start (start-up included), and the training compute to it over every run
        of this run_dir (as of the last log line)."""
        totals = self._totals()
        self.target = Target(target_bleu=target, bleu=bleu, update=updates, process_seconds=seconds_since_process_start(),
                             training_seconds=totals.seconds, target_tokens=totals.target_tokens,
                             model_flops=totals.model_flops)
        log.info(f"update {updates}: dev BLEU {bleu:.2f} reached train.target_bleu={target} after "
                 f"{self.target.process_seconds / 60:.1f} min")

    def record(self, updates: int, skipped: int) -> None:
        """The run record's training part, as of the checkpoint just written (main process)."""
        totals = self._totals()
        training = TrainingTotals(updates=updates, seconds=totals.seconds, model_flops=totals.model_flops,
                                  target_tokens=totals.target_tokens, skipped_updates=skipped,
                                  device=str(self.context.device), processes=self.context.world_size,
                                  precision=self.precision)
        run_record.record_training(self.run_dir, self.record_parts, training=training, valid=self.last_valid,
                                   target=self.target)

    def _totals(self) -> Compute:
        """Training seconds, model FLOPs and target tokens (whole) over every run of this
        run_dir so far (this run's compute as of its last log line)."""
        tokens = self.accounting.done / self.accounting.flops_per_token
        return Compute(seconds=self.previous.seconds + time.monotonic() - self.started,
                       model_flops=self.previous.model_flops + self.accounting.done,
                       target_tokens=round(self.previous.target_tokens + tokens))

    def report(self, updates: int, last_path: Path) -> None:
        """The run's last log line: throughput, padding and loss over all its updates."""
        elapsed = time.monotonic() - self.started
        totals = self.totals.summed(self.context)
        if totals.target_tokens:
            log.info(
                f"stopped at update {updates} after {elapsed / 60:.1f} min: {totals.target_tokens / elapsed:.0f} "
                f"target tokens/s, padding {totals.padding:.1%}, loss {totals.loss / totals.target_tokens:.3f}; "
                f"checkpoint {last_path}"
            )

    def close(self) -> None:
        for resource in (self.progress, self.writer):
            if resource is not None:
                resource.close()


_IMPORTED = time.monotonic()


def seconds_since_process_start() -> float:
    """Wall seconds since this process started (Linux: from /proc; elsewhere: since this module
    was imported, which is soon after)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()  # after "pid (name)"
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time, in ticks after boot
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED


def _progress_bar(total: int, initial: int):
    """A tqdm bar on an interactive terminal (log lines still go to the log file and console)."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="update", dynamic_ncols=True)


def _summary_writer(folder: Path):
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(folder))


def record_parts(cfg: TranslateConfig, data: PreparedData, model: Transformer, model_cfg: ModelConfig,
                 command: str) -> RunRecord:
    """What the run record says of the run itself: its settings, data and model, and the command
    that trains it."""
    train, settings = data.report.train, cfg.data
    facts = DataFacts(source=settings.path or settings.train, name=settings.name,
                      languages=[settings.src_lang, settings.tgt_lang], train_pairs=train.pairs,
                      train_pairs_kept=train.kept, train_tokens=TrainTokens(source=train.tokens_src, target=train.tokens_tgt),
                      vocabulary=VocabularyFacts(size=data.report.vocab_size, given=settings.spm_model,
                                                 specials=data.vocabulary.specials.as_dict()))
    sampled, copies = data.report.sampled, len(data.train_sampled)
    if sampled is not None and copies:
        facts.epoch_tokens = TrainTokens(source=sampled.tokens_src // copies, target=sampled.tokens_tgt // copies)
    return RunRecord(settings=to_plain(cfg), data=facts, model=ModelFacts(parameters=model.num_parameters(),
                                                                          config=to_plain(model_cfg)), commands=[command])
