"""The checkpoint file: self-describing `.pt` files, written atomically, read as data (weights
only), checked against the model they claim; and which numbered ones a run keeps. (Averaging
and the choice of a checkpoint to translate with: averaging.py.)

Contract (tools rely on it): torch.load gives a dict with `model` (a plain state_dict, no
`module.` or compile prefixes), `model_config` (ModelConfig fields), `vocabulary` (the
sentencepiece model's bytes), `specials` (the ids of pad, unk, bos, eos; absent in checkpoints
from before it was recorded: 0, 1, 2, 3), `languages`, `step`,
`lowercase` (absent before it was recorded: False; all built by `weights`), and for resuming
`optimizer` (torch's Adam state), `scheduler` (the schedule's applied updates and settings),
`config` (the whole configuration as plain values), `processes`, `valid`, `skipped_updates`.
"""

from __future__ import annotations

import errno
import logging
import pickle
import re
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from translate.core import paths
from translate.core.config import ModelConfig, from_plain, to_plain
from translate.core.errors import MissingCheckpoint, TranslateError, describe, os_error_in
from translate.data.vocabulary import SpecialIds, Vocabulary
from translate.model import Transformer

log = logging.getLogger("translate.checkpoint")

REQUIRED = ("model", "model_config", "vocabulary", "step")
# Errors of the operating system that say nothing of the file's contents (a truncated file makes
# torch's zip reader fail with EINVAL, say: that one is damage).
_NOT_THE_FILES_FAULT = {errno.EIO, errno.EACCES, errno.EPERM, errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ESTALE,
                        errno.ETIMEDOUT, errno.ENXIO, errno.ENODEV}


def weights(model: nn.Module, model_cfg: ModelConfig, vocabulary: Vocabulary, languages: List[str], step: int,
            lowercase: bool = False) -> Dict[str, Any]:
    """What decoding needs: weights (of the plain model, never a DistributedDataParallel or
    compiled wrapper, whose names differ), model config, sentencepiece model and the ids of the
    special symbols, languages, update, and whether its text was lowercased (data.lowercase)."""
    state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    return {"model": state, "model_config": to_plain(model_cfg), "vocabulary": vocabulary.model_bytes,
            "specials": vocabulary.specials.as_dict(), "languages": list(languages), "step": step,
            "lowercase": lowercase}


def save(path: Path, payload: Dict[str, Any]) -> None:
    """Write atomically and on disk (paths.atomic_write): a failed write (a full disk, a
    file-size limit) leaves the previous file as it was, and says so."""
    missing = [key for key in REQUIRED if key not in payload]
    if missing:
        raise ValueError(f"checkpoint payload lacks {missing}")
    with paths.atomic_write(path, binary=True, sync=True) as file:
        torch.save(payload, file)


def load(path: Path) -> Dict[str, Any]:
    """Read and validate a checkpoint; any problem is one TranslateError line.

    Nothing in the file runs: torch's weights-only unpickler builds tensors and plain data
    (dicts, lists, numbers, strings, bytes) and refuses any other object, so a pickle that
    would run code when opened is refused without running it."""
    try:
        # bytes: an empty vocabulary pickles as a call of bytes(), which builds nothing else.
        with warnings.catch_warnings(), torch.serialization.safe_globals([bytes]):
            warnings.simplefilter("ignore")  # torch warns of pickle protocols it may not read: the error says it
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise MissingCheckpoint(f"no checkpoint at {path}") from None
    except pickle.UnpicklingError as error:
        if "Weights only load failed" not in str(error):  # torch's refusal, as opposed to damage
            raise _damaged(path, error) from None
        found = re.search(r"GLOBAL (\S+)", str(error))
        what = f"an object of {found.group(1)}" if found else "objects other than tensors and plain data"
        raise TranslateError(f"{path} is not a plain checkpoint: it holds {what}, which could run code when "
                             "opened; refused, and nothing in it was run") from None
    except IsADirectoryError:
        raise TranslateError(f"{path} is a folder, not a checkpoint") from None
    except Exception as error:  # truncated or damaged: torch's zip reader or the unpickler fails
        failed = os_error_in(error)
        if failed is not None and failed.errno in _NOT_THE_FILES_FAULT:  # permissions, the disk, the system
            raise TranslateError(f"cannot read the checkpoint {path}: {describe(failed)}") from None
        raise _damaged(path, error) from None
    if not isinstance(payload, dict) or any(key not in payload for key in REQUIRED):
        raise TranslateError(f"{path} is not a translate checkpoint (needs keys {', '.join(REQUIRED)})")
    return payload


def identity(path: Path) -> Optional[Dict[str, Any]]:
    """Which weights a checkpoint holds, as `translate tune` records them beside the alpha it
    chose: the update they were written at and, for an average, the names of the checkpoints
    averaged. Read without the tensors (memory-mapped), so cheap at any size; None where it
    cannot be read (the verb that reads it then says why)."""
    try:
        with warnings.catch_warnings(), torch.serialization.safe_globals([bytes]):
            warnings.simplefilter("ignore")
            payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return {"step": int(payload["step"]), "averaged": [Path(p).name for p in payload.get("averaged", [])]}
    except Exception:  # missing, damaged, not a checkpoint: load() gives the one-line reason
        return None


def describe_identity(weights: Dict[str, Any]) -> str:
    averaged = weights.get("averaged") or []
    mean = f", the mean of {averaged[0]} .. {averaged[-1]}" if len(averaged) > 1 else ""
    return f"update {weights.get('step')}{mean}"


def _damaged(path: Path, error: Exception) -> TranslateError:
    reason = str(error).split(". ")[0].splitlines()[0].rstrip(".") if str(error).strip() else type(error).__name__
    return TranslateError(f"{path} cannot be read, it is damaged or truncated ({reason}); nothing was changed: "
                          "move it away, or use another checkpoint")


def model_config(payload: Dict[str, Any], path: Optional[Path] = None) -> ModelConfig:
    """The model settings a checkpoint holds; settings that cannot build a model are one
    TranslateError line naming the checkpoint (`path`)."""
    try:
        saved = {"vocab_multiple": 1, **payload["model_config"]}  # checkpoints from before vocabulary padding have none
        cfg = from_plain(ModelConfig, saved)  # older checkpoints: today's defaults for what they lack (post-norm, sinusoids)
    except (AttributeError, TypeError, ValueError) as error:
        raise TranslateError(f"{path or 'the checkpoint'}: its model settings (model_config) are not valid: {error}") from None
    return cfg


def vocabulary(payload: Dict[str, Any], path: Optional[Path] = None) -> Vocabulary:
    """The checkpoint's vocabulary with the special ids it was trained with; one that
    sentencepiece cannot read is one TranslateError line naming the checkpoint (`path`)."""
    where = f"{path or 'the checkpoint'}: its vocabulary (the sentencepiece model)"
    model = payload["vocabulary"]
    if not isinstance(model, bytes) or not model:
        raise TranslateError(f"{where} is {'empty' if isinstance(model, bytes) else 'not bytes'}: the checkpoint is damaged")
    try:
        specials = SpecialIds.from_dict(payload.get("specials"))
        return Vocabulary(model, specials)
    except RuntimeError:  # sentencepiece's parser: "INTERNAL: ... ParseFromArray"
        raise TranslateError(f"{where} cannot be read ({len(model):,} bytes): the checkpoint is damaged") from None
    except (TypeError, ValueError, KeyError, TranslateError) as error:
        raise TranslateError(f"{where} does not fit its special ids: {error}") from None


def check_weights(path: Path, state: Any, model_cfg: ModelConfig) -> None:
    """The weights (a state_dict) have every name of the model model_cfg describes, no other,
    each a tensor of the model's shape: else one TranslateError line naming the weight."""
    with _ShapesOnly():  # shapes only: the weights are never filled, so their pages never touched
        expected = {name: tensor.shape for name, tensor in Transformer(model_cfg).state_dict().items()}
    if not isinstance(state, dict):
        raise TranslateError(f"{path}: its weights (model) are not a state_dict: the checkpoint is damaged")
    missing, extra = [n for n in expected if n not in state], [n for n in state if n not in expected]
    for names, what in ((missing, "lacks the weight"), (extra, "holds a weight its model settings do not have:")):
        if names:
            more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
            raise TranslateError(f"{path} {what} {names[0]}{more}: the checkpoint is damaged, or of other code")
    for name, shape in expected.items():
        tensor = state[name]
        if not isinstance(tensor, torch.Tensor) or tensor.shape != shape:
            found = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise TranslateError(f"{path}: weight {name} is {found}, but its model settings need {tuple(shape)}: "
                                 "the checkpoint is damaged")


class _ShapesOnly(TorchFunctionMode):
    """Skips every in-place fill (the layers' initializers): building a model for its weights'
    shapes then allocates memory it never touches. The meta device, which would allocate
    nothing, routes its operations through torch's compiler, whose first use imports
    torch._dynamo: a second of every resume and average, for nothing."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")  # torch.nn.init passes it by name
        name = getattr(func, "__name__", "")
        if isinstance(target, torch.Tensor) and name.endswith("_") and not name.startswith("__"):
            return target
        return func(*args, **kwargs)


def describe_difference(saved: ModelConfig, wanted: ModelConfig) -> str:
    """'d_model 512 != 256, ...' for the fields that differ (dropout aside: it changes how a
    model trains, not what its weights mean)."""
    a, b = asdict(saved), asdict(wanted)
    return ", ".join(f"{k} {a[k]} != {b[k]}" for k in a if a[k] != b[k] and k != "dropout")


def check_same_model(path: Path, payload: Dict[str, Any], model_cfg: ModelConfig, model_bytes: bytes,
                     specials: SpecialIds, advice: str = "use another run_dir, or move the checkpoint away") -> None:
    """Refuse a checkpoint of another model than model_cfg, or of another vocabulary than the
    sentencepiece model `model_bytes` with these special ids, naming what differs (and
    `advice`, what to do about it)."""
    difference = describe_difference(model_config(payload, path), model_cfg)
    if difference:
        raise TranslateError(f"{path} holds a different model ({difference}): {advice}")
    if payload["vocabulary"] != model_bytes or SpecialIds.from_dict(payload.get("specials")) != specials:
        raise TranslateError(f"{path} was trained with another vocabulary: {advice}")


def prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest keep_last numbered checkpoints."""
    for path in paths.numbered_checkpoints(run_dir)[: -keep_last or None] if keep_last > 0 else []:
        path.unlink(missing_ok=True)


