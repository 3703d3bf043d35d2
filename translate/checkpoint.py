"""Checkpoints: self-describing `.pt` files, written atomically.

Contract (tools rely on it): torch.load gives a dict with `model` (a plain state_dict, no
`module.` or compile prefixes), `model_config` (ModelConfig fields), `vocabulary` (the
sentencepiece model's bytes), `specials` (the ids of pad, unk, bos, eos; absent in checkpoints
from before it was recorded: 0, 1, 2, 3), `languages`, `step` (all built by `weights`), and for resuming
`optimizer` (torch's Adam state), `scheduler` (the schedule's applied updates and settings),
`config` (the whole configuration as plain values), `processes`, `valid`, `skipped_updates`.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Dict, List

import torch
from torch import nn

from translate import paths
from translate.config import ModelConfig, TranslateConfig
from translate.data.vocabulary import SpecialIds, Vocabulary
from translate.errors import MissingCheckpoint, TranslateError

log = logging.getLogger("translate.checkpoint")

REQUIRED = ("model", "model_config", "vocabulary", "step")


def weights(model: nn.Module, model_cfg: ModelConfig, vocabulary: Vocabulary, languages: List[str], step: int) -> Dict[str, Any]:
    """What decoding needs: weights (of the plain model, never a DistributedDataParallel or
    compiled wrapper, whose names differ), model config, sentencepiece model and the ids of the
    special symbols, languages, update."""
    state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    return {"model": state, "model_config": asdict(model_cfg), "vocabulary": vocabulary.model_bytes,
            "specials": vocabulary.specials.as_dict(), "languages": list(languages), "step": step}


def save(path: Path, payload: Dict[str, Any]) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over `path`."""
    missing = [key for key in REQUIRED if key not in payload]
    if missing:
        raise ValueError(f"checkpoint payload lacks {missing}")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load(path: Path) -> Dict[str, Any]:
    """Read and validate a checkpoint; any problem is one TranslateError line."""
    if not path.is_file():
        raise MissingCheckpoint(f"no checkpoint at {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:
        raise TranslateError(f"{path} is not a readable checkpoint: {str(error).splitlines()[0]}") from None
    if not isinstance(payload, dict) or any(key not in payload for key in REQUIRED):
        raise TranslateError(f"{path} is not a translate checkpoint (needs keys {', '.join(REQUIRED)})")
    return payload


def model_config(payload: Dict[str, Any]) -> ModelConfig:
    names = {f.name for f in fields(ModelConfig)}
    saved = {k: v for k, v in payload["model_config"].items() if k in names}
    saved.setdefault("vocab_multiple", 1)  # checkpoints from before vocabulary padding have none
    return ModelConfig(**saved)


def vocabulary(payload: Dict[str, Any]) -> Vocabulary:
    """The checkpoint's vocabulary with the special ids it was trained with."""
    return Vocabulary(payload["vocabulary"], SpecialIds.from_dict(payload.get("specials")))


def describe_difference(saved: ModelConfig, wanted: ModelConfig) -> str:
    """'d_model 512 != 256, ...' for the fields that differ."""
    a, b = asdict(saved), asdict(wanted)
    return ", ".join(f"{k} {a[k]} != {b[k]}" for k in a if a[k] != b[k] and k != "dropout")


def numbered(run_dir: Path) -> List[Path]:
    """The numbered checkpoints in run_dir (checkpoint_<update>.pt), oldest first."""
    found = [(int(m.group(1)), p) for p in run_dir.glob("checkpoint_*.pt") if (m := re.fullmatch(r"checkpoint_(\d+)\.pt", p.name))]
    return [p for _, p in sorted(found)]


def prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest keep_last numbered checkpoints."""
    for path in numbered(run_dir)[: -keep_last or None] if keep_last > 0 else []:
        path.unlink(missing_ok=True)


def average(sources: List[Path]) -> Dict[str, Any]:
    """Element-wise mean of the weights of checkpoints of one model (paper, section 6.1)."""
    if not sources:
        raise TranslateError("no checkpoints to average")
    payloads = [load(path) for path in sources]
    first = payloads[0]
    for path, payload in zip(sources[1:], payloads[1:]):
        specials = [SpecialIds.from_dict(p.get("specials")) for p in (payload, first)]
        same_vocabulary = payload["vocabulary"] == first["vocabulary"] and specials[0] == specials[1]
        if payload["model_config"] != first["model_config"] or not same_vocabulary:
            raise TranslateError(f"{path} holds another model or vocabulary than {sources[0]}: cannot average them")
    mean = {}
    for name, tensor in first["model"].items():
        stacked = torch.stack([p["model"][name].to(torch.float64) for p in payloads])
        mean[name] = stacked.mean(dim=0).to(tensor.dtype)
    result = {key: first[key] for key in ("model_config", "vocabulary", "specials", "languages") if key in first}
    result.update(model=mean, step=payloads[-1]["step"], averaged=[str(p) for p in sources])
    return result


def average_last(run_dir: Path, count: int) -> Path:
    """Write run_dir/checkpoint_average.pt from the newest `count` numbered checkpoints."""
    sources = numbered(run_dir)[-count:]
    if not sources:
        raise TranslateError(f"no numbered checkpoints (checkpoint_<update>.pt) in {run_dir} to average")
    destination = run_dir / paths.AVERAGE_CHECKPOINT
    save(destination, average(sources))
    log.info(f"wrote {destination}: the mean of {len(sources)} checkpoints ({sources[0].name} .. {sources[-1].name})")
    return destination


def average_verb(cfg: TranslateConfig) -> Path:
    """`translate average`: average the last checkpoint.average_last numbered checkpoints of run_dir."""
    if cfg.checkpoint.average_last < 1:
        raise TranslateError("checkpoint.average_last is 0: set checkpoint.average_last=N to average the last N")
    return average_last(Path(cfg.run_dir), cfg.checkpoint.average_last)


def for_decoding(cfg: TranslateConfig) -> Path:
    """The checkpoint decode uses; the average is (re)built first when the numbered checkpoints
    are newer than it, so that train, decode, bleu need no extra step."""
    path = paths.checkpoint(cfg)
    if not cfg.decode.checkpoint and path.name == paths.AVERAGE_CHECKPOINT:
        sources = numbered(path.parent)
        if not sources and not path.is_file():  # nothing to average: the last checkpoint, if any
            return path.parent / paths.LAST_CHECKPOINT
        stale = not path.is_file() or (sources and sources[-1].stat().st_mtime > path.stat().st_mtime)
        if stale and sources:
            average_last(path.parent, cfg.checkpoint.average_last)
    return path
