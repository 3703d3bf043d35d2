"""The `translate average` verb: run_dir's last checkpoint.average_last numbered checkpoints
averaged into checkpoint_average.pt (which decode also builds by itself when it is stale)."""

from __future__ import annotations

from pathlib import Path

from translate import averaging
from translate.core.config import TranslateConfig
from translate.core.errors import TranslateError


def average(cfg: TranslateConfig) -> Path:
    """`translate average`: average the last checkpoint.average_last numbered checkpoints of run_dir."""
    if cfg.checkpoint.average_last < 1:
        raise TranslateError("checkpoint.average_last is 0: set checkpoint.average_last=N to average the last N")
    return averaging.average_last(Path(cfg.run_dir), cfg.checkpoint.average_last)
