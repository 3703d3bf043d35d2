"""Checkpoints: self-describing `.pt` files, written atomically.

Contract (tools rely on it): torch.load gives a dict with `model` (a plain state_dict, no
`module.` or compile prefixes), `model_config` (ModelConfig fields), `vocabulary` (the
sentencepiece model's bytes), `step`, and for resuming `optimizer`, `scheduler`, `config`.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Dict

import torch
from torch import nn

from translate.config import ModelConfig
from translate.errors import TranslateError

REQUIRED = ("model", "model_config", "vocabulary", "step")


def plain_state_dict(model: nn.Module) -> Dict[str, torch.Tensor]:
    """The model's weights without DistributedDataParallel or torch.compile wrappers."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = getattr(model, "module", None) or getattr(model, "_orig_mod")
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


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
        raise TranslateError(f"no checkpoint at {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:
        raise TranslateError(f"{path} is not a readable checkpoint: {str(error).splitlines()[0]}") from None
    if not isinstance(payload, dict) or any(key not in payload for key in REQUIRED):
        raise TranslateError(f"{path} is not a translate checkpoint (needs keys {', '.join(REQUIRED)})")
    return payload


def model_config(payload: Dict[str, Any]) -> ModelConfig:
    names = {f.name for f in fields(ModelConfig)}
    return ModelConfig(**{k: v for k, v in payload["model_config"].items() if k in names})


def describe_difference(saved: ModelConfig, wanted: ModelConfig) -> str:
    """'d_model 512 != 256, ...' for the fields that differ."""
    a, b = asdict(saved), asdict(wanted)
    return ", ".join(f"{k} {a[k]} != {b[k]}" for k in a if a[k] != b[k] and k != "dropout")
