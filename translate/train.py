"""The `translate train` verb: one training of run_dir by every process of the job, holding
run_dir's lock, through the Trainer (translate.training); the one module outside
translate/training/ that imports it.

Knows nothing of Hydra: takes the typed TranslateConfig.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from translate.config import TranslateConfig
from translate.errors import TranslateError
from translate.training import distributed
from translate.training.run_lock import RunLock
from translate.training.trainer import Trainer

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
        trainer = Trainer.setup(cfg, context)
        try:
            return trainer.train()
        finally:
            trainer.cleanup()
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
