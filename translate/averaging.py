"""Checkpoint averaging (paper, section 6.1: "averaging the last 5 checkpoints, which were
written at 10-minute intervals", 20 for big), and the one choice of the checkpoint that the
verbs which translate use: the one given, else the average where the preset asks for one,
rebuilt when stale, else the last.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import List

import torch

from translate.checkpoint import Checkpoint
from translate.core import paths
from translate.core.config import TranslateConfig
from translate.core.errors import MissingCheckpoint, TranslateError

log = logging.getLogger(__name__)


def average(sources: List[Path]) -> Checkpoint:
    """Element-wise mean of the weights of checkpoints of one model (paper, section 6.1)."""
    if not sources:
        raise TranslateError("no checkpoints to average")
    loaded = [Checkpoint.load(path) for path in sources]
    first, first_cfg = loaded[0], loaded[0].model_config()
    first.check_weights(first_cfg)
    for other in loaded[1:]:
        other.check_same_model(first_cfg, first.sentencepiece, first.special_ids(), f"it cannot be averaged with {sources[0]}")
        other.check_weights(first_cfg)
    mean = {}
    for name, tensor in first.model.items():
        stacked = torch.stack([c.model[name].to(torch.float64) for c in loaded])
        mean[name] = stacked.mean(dim=0).to(tensor.dtype)
    return Checkpoint(mean, first.settings, first.sentencepiece, loaded[-1].step, specials=first.specials,
                      languages=first.languages, lowercase=first.lowercase, averaged=[str(p) for p in sources])


def average_last(run_dir: Path, count: int, tries: int = 3) -> Path:
    """Write run_dir/checkpoint_average.pt from the newest `count` numbered checkpoints. A
    training in run_dir may delete the oldest of them meanwhile (checkpoint.keep_last): then
    they are listed again."""
    for attempt in range(tries):
        sources = paths.numbered_checkpoints(run_dir)[-count:]
        if not sources:
            raise TranslateError(f"no numbered checkpoints (checkpoint_<update>.pt) in {run_dir} to average")
        try:
            averaged = average(sources)
            break
        except MissingCheckpoint:
            if attempt == tries - 1:
                raise
    destination = run_dir / paths.AVERAGE_CHECKPOINT
    averaged.save(destination)
    log.info(f"wrote {destination}: the mean of {len(sources)} checkpoints ({sources[0].name} .. {sources[-1].name})")
    return destination


def _modified(path: Path) -> float:
    """A file's modification time; +inf for one a training has just deleted (so: rebuild)."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return float("inf")


def chosen_checkpoint(cfg: TranslateConfig) -> Path:
    """The checkpoint decode (and tune, plot, export) uses: decode.checkpoint; else, where the
    preset averages (checkpoint.average_last), the average of run_dir's last numbered
    checkpoints, (re)built first when they are newer than it, so that train, decode, bleu need
    no extra step; else (or with nothing to average) the last checkpoint train wrote."""
    path = paths.checkpoint_to_translate(Path(cfg.run_dir), cfg.decode.checkpoint, cfg.checkpoint.average_last)
    if cfg.decode.checkpoint or path.name != paths.AVERAGE_CHECKPOINT:
        return path
    if _stale(path, paths.numbered_checkpoints(Path(cfg.run_dir))):
        average_last(Path(cfg.run_dir), cfg.checkpoint.average_last)
    return path


def _stale(average: Path, sources: List[Path]) -> bool:
    """An average to (re)build: there is something to average, and no average or an older one."""
    return bool(sources) and (not average.is_file() or _modified(sources[-1]) > _modified(average))
