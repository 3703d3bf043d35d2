"""The `translate train` verb: one training of run_dir by every process of the job, holding
run_dir's lock, through the Trainer (translate.training); the one module outside
translate/training/ that imports it.

Knows nothing of Hydra: takes the typed TranslateConfig.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn, Optional

import torch
import torch.distributed as dist

from translate import checkpoint
from translate.core import run_record
from translate.core.command_line import CommandLine
from translate.core.config import TranslateConfig
from translate.core.errors import TranslateError, headline
from translate.core.run_record import Restart
from translate.training import distributed
from translate.training.run_lock import RunLock
from translate.training.trainer import Trainer
from translate.training.watchdog import Watchdog

log = logging.getLogger(__name__)
package_log = logging.getLogger("translate")  # every module's logger is below it


def train(cfg: TranslateConfig, command: Optional[CommandLine] = None) -> Path:
    """Train until train.max_steps updates or train.max_minutes; returns the last checkpoint.

    Under torchrun every process trains its share of each update (DistributedDataParallel);
    only the main process logs and writes checkpoints, and holds run_dir's lock for the job.
    """
    context = distributed.init()
    # What a run changes in the process comes back afterwards, so that the next job of a
    # multirun sweep (run one after another in this process) starts clean.
    threads, level = torch.get_num_threads(), package_log.level
    lock = RunLock(Path(cfg.run_dir))
    watchdog, trainer = None, None
    try:
        if context.distributed and cfg.train.stall_timeout > 0:  # the processes watch each other
            watchdog = Watchdog.for_job(context, cfg.train.stall_timeout)
            watchdog.start()
        _own(lock, context)
        trainer = Trainer.setup(cfg, context, (command or CommandLine("train")).text())
        if context.attempt and context.is_main:
            _restarted(Path(cfg.run_dir), context.attempt, trainer.state.updates, watchdog)
        try:
            return trainer.train()
        except Exception as error:  # named while the stop signals are still caught
            _raise_named(error, watchdog)
        finally:
            context.activity.doing("ending the run")
            trainer.cleanup()
    except Exception as error:
        _raise_named(error, watchdog)
    finally:
        if watchdog is not None:
            watchdog.close()
        lock.release()
        distributed.shutdown(context)
        torch.set_num_threads(threads)
        package_log.setLevel(level)
        # Last: torchrun sends SIGTERM to every worker once one has died, and a SIGTERM taken
        # by the default handler while this process tears down would end it before its error's
        # line (the one that names the dead process) is printed.
        if trainer is not None:
            trainer.stop_signals.close()


def _raise_named(error: Exception, watchdog: Optional[Watchdog]) -> NoReturn:
    """Raise a collective that failed (a process of the job died or failed) as the line that
    names that process, rather than the closed connection the collective saw; any other error
    as it is, after telling the other processes (through the watchdog) that this one failed."""
    if watchdog is None:
        raise error
    if isinstance(error, TranslateError) or not _collective_failure(error):
        watchdog.failed(str(error) if isinstance(error, TranslateError) else headline(error))
        raise error
    line = watchdog.explain()
    if line is None:
        raise error
    raise TranslateError(line) from error


def _collective_failure(error: Exception) -> bool:
    """Whether an error came from a collective operation between the processes (gloo's and
    NCCL's errors, and the closed connections of a peer that died)."""
    text = str(error)
    return isinstance(error, dist.DistError) or any(
        sign in text for sign in ("Connection closed by peer", "Connection reset by peer", "gloo", "NCCL"))


def _restarted(run_dir: Path, attempt: int, resumed_from: int, watchdog: Optional[Watchdog]) -> None:
    """A restarted attempt of torchrun's (--max-restarts): a line, and its note in the run record,
    with why the attempt before it ended where that one's processes said (their watchdog's)."""
    cause = watchdog.previous_cause() if watchdog is not None else None
    log.warning(f"torchrun's restart {attempt} of at most {os.environ.get('TORCHELASTIC_MAX_RESTARTS', '?')}: "
                f"resuming at update {resumed_from}" + (f"; the attempt before ended: {cause}" if cause else ""))
    run_record.record_restart(run_dir, Restart(attempt=attempt, at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                               resumed_from=resumed_from, cause=cause))


def _own(lock: RunLock, context: distributed.Context) -> None:
    """The main process takes run_dir's lock for the whole job; if another training holds it,
    every process of this job stops with the holder's name, before anything is written."""
    problem = None
    if context.is_main:
        try:
            lock.acquire()
        except TranslateError as error:
            problem = str(error)
        else:
            removed = checkpoint.remove_unfinished(lock.path.parent)
            if removed:
                log.warning(f"removed what a training killed while saving left half-written: {', '.join(removed)}")
    problem = distributed.from_main(problem, context)
    if problem:
        raise TranslateError(problem)
