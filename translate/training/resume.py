"""Resuming exactly: the training state a checkpoint_last.pt holds (weights, optimizer,
schedule, loss scaler, every process's random state and data position) restored only into
the same model trained with the same settings; fine-tuning from another run's weights."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
from torch import nn

from translate.checkpoint import Checkpoint
from translate.core import paths
from translate.core.choices import Decay
from translate.core.config import ModelConfig, OptimConfig, TranslateConfig, to_plain
from translate.core.errors import MissingCheckpoint, TranslateError, first_line
from translate.core.precision import MixedPrecision
from translate.data.batching import BatchStream
from translate.data.cache import PreparedData
from translate.data.vocabulary import Vocabulary
from translate.training import distributed
from translate.training.optim import Adam
from translate.training.schedule import LearningRateSchedule
from translate.training.validate import Tracker

log = logging.getLogger(__name__)


def check_same_settings(saved: Checkpoint, optim: OptimConfig, max_steps: Optional[int] = None) -> None:
    """Refuse to resume with optimizer or schedule settings other than the checkpoint's: the
    run would not continue as saved (the schedule would jump, say). A linear decay ends at
    train.max_steps, so that is one of its settings."""
    trained = saved.config or {}
    before = trained.get("optim", {})
    wanted = to_plain(optim)
    differences = [f"optim.{key}={wanted[key]} (saved: {before[key]})" for key in wanted if key in before and before[key] != wanted[key]]
    saved_steps = trained.get("train", {}).get("max_steps")
    if optim.decay == Decay.linear and max_steps is not None and saved_steps not in (None, max_steps):
        differences.append(f"train.max_steps={max_steps} (saved: {saved_steps}, where optim.decay=linear ends)")
    if differences:
        raise TranslateError(
            f"{saved.path} was trained with other settings: {', '.join(differences)}; a resume continues exactly as saved, "
            f"so restore them, or start afresh from its weights with train.init_from={saved.path} in another run_dir"
        )


def load_training_state(path: Path, model: nn.Module, model_cfg: ModelConfig, vocabulary: Vocabulary, *,
                        optim: OptimConfig, optimizer: Adam, schedule: LearningRateSchedule,
                        scaler: Optional["torch.amp.GradScaler"]) -> Optional[Checkpoint]:
    """Restore what checkpoint_last.pt at `path` holds into the model, optimizer, schedule and
    scaler; returns the checkpoint (for the process states), or None where there is none yet.
    Each part is checked before use: a damaged one is one line naming it."""
    try:
        saved = Checkpoint.load(path)
    except MissingCheckpoint:
        return None
    saved.check_same_model(model_cfg, vocabulary.model_bytes, vocabulary.specials)
    check_same_settings(saved, optim, schedule.last_update if schedule is not None else None)
    saved.check_weights(model_cfg)
    model.load_state_dict(saved.model)
    if saved.optimizer is not None:
        _restore(path, "optimizer state", optimizer.load_state_dict, saved.optimizer)
        _restore(path, "schedule state", schedule.load_state_dict, saved.scheduler)
    if scaler is not None and saved.scaler is not None:
        _restore(path, "loss scaler state", scaler.load_state_dict, saved.scaler)
    return saved


def _restore(path: Path, part: str, load, state: Any) -> None:
    """load(state), a damaged state being one line naming the checkpoint and the part."""
    try:
        load(state)
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as error:
        raise TranslateError(f"{path}: its {part} cannot be restored ({first_line(error)}): the checkpoint is damaged; "
                             "move it away to start afresh, or use train.init_from for its weights") from None


def load_weights(path: Path, model: nn.Module, model_cfg: ModelConfig, vocabulary: Vocabulary) -> None:
    """Fine-tuning (train.init_from): another run's weights, nothing else."""
    saved = Checkpoint.load(path)
    saved.check_same_model(model_cfg, vocabulary.model_bytes, vocabulary.specials)
    saved.check_weights(model_cfg)
    model.load_state_dict(saved.model)


def process_state(batches: BatchStream) -> Dict:
    state = {"torch": torch.get_rng_state(), "batches": batches.state_dict()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def gather_process_states(context: distributed.Context, batches: BatchStream) -> List[Dict]:
    """Every process's random state and data position (for an exact resume), on rank 0."""
    return distributed.gather_objects(process_state(batches), context)


def restore_process_state(saved: Checkpoint, context: distributed.Context, batches: BatchStream, tracker: Tracker) -> None:
    states = saved.processes
    if states is None or len(states) != context.world_size:
        log.warning("the checkpoint was written by another number of processes: data order and random state restart")
        return
    state = states[context.rank]
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    batches.load_state_dict(state["batches"])
    tracker.load_state_dict(saved.valid or {})


def start(cfg: TranslateConfig, data: PreparedData, model: nn.Module, model_cfg: ModelConfig, *, optimizer: Adam,
          schedule: LearningRateSchedule, precision: MixedPrecision) -> Optional[Checkpoint]:
    """Resume from checkpoint_last.pt where there is one, else start (from train.init_from's
    weights, if set); returns the checkpoint resumed."""
    last = Path(cfg.run_dir) / paths.LAST_CHECKPOINT
    resumed = load_training_state(last, model, model_cfg, data.vocabulary, optim=cfg.optim, optimizer=optimizer,
                                  schedule=schedule, scaler=precision.scaler)
    if resumed is not None:
        log.info(f"resuming from {last} at update {resumed.step}")
    elif cfg.train.init_from:
        load_weights(Path(cfg.train.init_from), model, model_cfg, data.vocabulary)
        log.info(f"starting from the weights of {cfg.train.init_from} (fresh optimizer and schedule)")
    return resumed
