"""The checkpoint file: self-describing `.pt` files, written atomically, read as data (weights
only), checked against the model they claim; which numbered ones a run keeps; and the decoding
settings `translate tune` chose for the weights, in a file beside them. (Averaging and the
choice of a checkpoint to translate with: averaging.py.)

Contract (tools rely on it): torch.load gives a dict with `model` (a plain state_dict, no
`module.` or compile prefixes), `model_config` (ModelConfig fields), `vocabulary` (the
sentencepiece model's bytes), `specials` (the ids of pad, unk, bos, eos; absent: 0, 1, 2, 3),
`languages`, `step`, `lowercase` (absent: False), for an average `averaged` (the checkpoints it
is the mean of), for checkpoint_best.pt `dev` (its dev metrics), and for resuming `optimizer`
(torch's Adam state), `scheduler` (the schedule's applied updates and settings), `config` (the
whole configuration as plain values), `processes`, `valid`, `skipped_updates`, `scaler`. The
Checkpoint class is that dict with names; no other module reads its keys.

Beside `<name>.pt`, `<name>.pt.generation.json` (GenerationSettings) holds the length penalty
tune chose for it, with the identity of the weights it was chosen for: other weights at that
path later (a rebuilt average, a checkpoint_last.pt trained on) do not take it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import pickle
import re
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from translate.core import paths, run_record
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
GENERATION_SUFFIX = ".generation.json"  # beside a checkpoint: the settings tune chose for its weights
_SAMPLED = 1024  # values of each weight that Identity's hash reads


@dataclass(frozen=True)
class Identity:
    """Which weights a checkpoint holds, cheaply told apart: the update they were written at,
    for an average the names of the checkpoints averaged, and a hash of evenly spaced values of
    every weight (a sample: hashing a large model whole would take seconds). Written as
    {update, averaged, fingerprint} wherever a file names weights (tune's settings and history,
    decode's record: run_record.Weights)."""

    update: int  # the checkpoint's step: the updates its weights have seen
    averaged: Tuple[str, ...] = ()
    fingerprint: str = ""

    def describe(self) -> str:
        mean = f", the mean of {self.averaged[0]} .. {self.averaged[-1]}" if len(self.averaged) > 1 else ""
        return f"update {self.update}{mean}"


@dataclass
class Checkpoint:
    """One checkpoint file, its fields named (the module's docstring: the keys they are saved as)."""

    model: Dict[str, Any]  # the plain model's state_dict
    settings: Dict[str, Any]  # ModelConfig's fields as saved (`model_config`; model_config() reads them)
    sentencepiece: bytes  # the vocabulary's sentencepiece model (`vocabulary`; vocabulary() reads it)
    step: int
    specials: Optional[Dict[str, int]] = None  # None: recorded before specials were, the default layout
    languages: Optional[List[str]] = None  # [src_lang, tgt_lang]
    lowercase: bool = False  # trained on lowercased text (data.lowercase)
    averaged: Optional[List[str]] = None  # an average: the paths of the checkpoints averaged
    dev: Optional[Dict[str, Any]] = None  # checkpoint_best.pt: the dev metrics that made it the best
    # checkpoint_last.pt's state for resuming exactly (training/resume.py):
    optimizer: Optional[Dict[str, Any]] = None
    scheduler: Optional[Dict[str, Any]] = None
    scaler: Optional[Dict[str, Any]] = None
    config: Optional[Dict[str, Any]] = None  # the whole configuration as plain values
    processes: Optional[List[Dict[str, Any]]] = None  # every process's random state and data position
    valid: Optional[Dict[str, Any]] = None  # the validation tracker's state
    skipped_updates: Optional[int] = None
    path: Optional[Path] = field(default=None, compare=False, repr=False)  # where it was read: named in errors

    @classmethod
    def of_model(cls, model: nn.Module, model_cfg: ModelConfig, vocabulary: Vocabulary, languages: List[str], step: int,
                 lowercase: bool = False) -> "Checkpoint":
        """What decoding needs: weights (of the plain model, never a DistributedDataParallel or
        compiled wrapper, whose names differ), model config, sentencepiece model and the ids of the
        special symbols, languages, update, and whether its text was lowercased (data.lowercase)."""
        state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
        return cls(state, to_plain(model_cfg), vocabulary.model_bytes, step, specials=vocabulary.specials.as_dict(),
                   languages=list(languages), lowercase=lowercase)

    @classmethod
    def from_payload(cls, payload: Dict[str, Any], path: Optional[Path] = None) -> "Checkpoint":
        if not isinstance(payload, dict) or any(key not in payload for key in REQUIRED):
            raise TranslateError(f"{path or 'the checkpoint'} is not a translate checkpoint (needs keys {', '.join(REQUIRED)})")
        named = {key: payload.get(key) for key in _RESUME + ("specials", "languages", "averaged", "dev")}
        return cls(payload["model"], payload["model_config"], payload["vocabulary"], payload["step"],
                   lowercase=bool(payload.get("lowercase", False)), path=path, **named)

    def payload(self) -> Dict[str, Any]:
        """The dict torch.save writes, its keys in the order they have always been written."""
        found = {"model": self.model, "model_config": self.settings, "vocabulary": self.sentencepiece,
                 "specials": self.specials, "languages": self.languages, "step": self.step, "lowercase": self.lowercase}
        if self.averaged is not None:  # averaging.average's order: the model's description, then the mean
            found = {**{k: v for k, v in found.items() if k not in ("model", "step")}, "model": self.model,
                     "step": self.step, "averaged": self.averaged}
        found.update((key, getattr(self, key)) for key in ("dev",) + _RESUME)
        return {key: value for key, value in found.items() if value is not None}

    @classmethod
    def load(cls, path: Path) -> "Checkpoint":
        """Read and validate a checkpoint (load); any problem is one TranslateError line."""
        return cls.from_payload(load(path), path)

    def save(self, path: Path) -> None:
        """Write atomically and on disk (save)."""
        save(path, self.payload())

    def identity(self) -> Identity:
        """Which weights these are (Identity), to bind settings chosen for them."""
        digest = hashlib.blake2b(digest_size=8)
        for name in sorted(self.model):
            flat = self.model[name].detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // _SAMPLED)].contiguous()  # (at most about 2 x _SAMPLED,)
            digest.update(name.encode())
            digest.update(sample.view(torch.uint8).numpy().tobytes())
        return Identity(int(self.step), tuple(Path(p).name for p in self.averaged or []), digest.hexdigest())

    def model_config(self) -> ModelConfig:
        """The model settings it holds; settings that cannot build a model are one TranslateError
        line naming the checkpoint."""
        try:
            saved = {"vocab_multiple": 1, **self.settings}  # before vocabulary padding: none
            return from_plain(ModelConfig, saved)  # what older ones lack: today's defaults (post-norm, sinusoids)
        except (AttributeError, TypeError, ValueError) as error:
            raise TranslateError(f"{self._name}: its model settings (model_config) are not valid: {error}") from None

    def special_ids(self) -> SpecialIds:
        return SpecialIds.from_dict(self.specials)

    def vocabulary(self) -> Vocabulary:
        """Its vocabulary with the special ids it was trained with; one that sentencepiece cannot
        read is one TranslateError line naming the checkpoint."""
        where = f"{self._name}: its vocabulary (the sentencepiece model)"
        model = self.sentencepiece
        if not isinstance(model, bytes) or not model:
            raise TranslateError(f"{where} is {'empty' if isinstance(model, bytes) else 'not bytes'}: the checkpoint is damaged")
        try:
            return Vocabulary(model, self.special_ids())
        except RuntimeError:  # sentencepiece's parser: "INTERNAL: ... ParseFromArray"
            raise TranslateError(f"{where} cannot be read ({len(model):,} bytes): the checkpoint is damaged") from None
        except (TypeError, ValueError, KeyError, TranslateError) as error:
            raise TranslateError(f"{where} does not fit its special ids: {error}") from None

    def check_weights(self, model_cfg: ModelConfig) -> None:
        """Its weights have every name of the model model_cfg describes, no other, each a tensor
        of the model's shape: else one TranslateError line naming the weight."""
        path, state = self._name, self.model
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

    def check_same_model(self, model_cfg: ModelConfig, model_bytes: bytes, specials: SpecialIds,
                         advice: str = "use another run_dir, or move the checkpoint away") -> None:
        """Refuse a checkpoint of another model than model_cfg, or of another vocabulary than the
        sentencepiece model `model_bytes` with these special ids, naming what differs (and
        `advice`, what to do about it)."""
        difference = describe_difference(self.model_config(), model_cfg)
        if difference:
            raise TranslateError(f"{self._name} holds a different model ({difference}): {advice}")
        if self.sentencepiece != model_bytes or self.special_ids() != specials:
            raise TranslateError(f"{self._name} was trained with another vocabulary: {advice}")

    def generation(self) -> Optional["GenerationSettings"]:
        """The settings translate tune chose for these weights (<path>.generation.json); None where
        it chose none, or chose them for other weights once at this path, which a warning names."""
        if self.path is None:
            return None
        tuned = GenerationSettings.read(self.path)
        older = run_record.tuned_by_older_version(self.path.parent, self.path) if tuned is None else None
        if older is not None:  # said, so that a run tuned before keeps no alpha silently
            log.warning(f"{self.path}: translate tune chose alpha {older} for it before its choice was kept beside the "
                        "weights; it is not used: translate tune again keeps one beside them")
        if tuned is not None and tuned.weights != self.identity():
            log.warning(f"{GenerationSettings.beside(self.path)}: translate tune chose alpha {tuned.length_penalty} for "
                        f"{self.path.name} when it held {tuned.weights.describe()}; it holds "
                        f"{self.identity().describe()} now: not used (translate tune again chooses one for these weights)")
            return None
        return tuned

    @property
    def _name(self) -> str:
        return str(self.path) if self.path is not None else "the checkpoint"


_RESUME = ("optimizer", "scheduler", "config", "processes", "valid", "skipped_updates", "scaler")


@dataclass
class GenerationSettings:
    """The decoding settings translate tune chose for some weights, kept beside their checkpoint
    (<checkpoint>.generation.json) as Hugging Face's generation_config.json beside a model:
    the alpha, how it was chosen (the beam, the split and its sentences, each alpha's scores,
    the command), and the identity of the weights it was chosen for."""

    length_penalty: float
    beam_size: int
    weights: Identity
    split: str = ""
    sentences: int = 0
    scores: List[Dict[str, Any]] = field(default_factory=list)
    command: str = ""

    @staticmethod
    def beside(checkpoint: Path) -> Path:
        return Path(checkpoint).with_name(Path(checkpoint).name + GENERATION_SUFFIX)

    def origin(self) -> str:
        return (f"chosen by translate tune on {self.sentences:,} sentences of the {self.split} split at beam "
                f"{self.beam_size}, for {self.weights.describe()}")

    def as_dict(self) -> Dict[str, Any]:
        found = asdict(self)
        found["weights"]["averaged"] = list(self.weights.averaged)
        return found

    def write(self, checkpoint: Path) -> Path:
        """Beside the checkpoint, atomically; the checkpoint itself is never rewritten."""
        path = self.beside(checkpoint)
        with paths.atomic_write(path) as file:
            file.write(json.dumps(self.as_dict(), indent=2, ensure_ascii=False) + "\n")
        return path

    @classmethod
    def read(cls, checkpoint: Path) -> Optional["GenerationSettings"]:
        """The settings beside this checkpoint; None where there are none; one TranslateError line
        where they cannot be read."""
        path = cls.beside(checkpoint)
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            named = saved["weights"]
            update = named["update"] if "update" in named else named["step"]  # "step": written before the shapes were one
            weights = Identity(int(update), tuple(named.get("averaged", ())),
                               str(named.get("fingerprint", "")))
            return cls(float(saved["length_penalty"]), int(saved["beam_size"]), weights, split=str(saved.get("split", "")),
                       sentences=int(saved.get("sentences", 0)), scores=list(saved.get("scores", [])),
                       command=str(saved.get("command", "")))
        except FileNotFoundError:
            return None
        except OSError as error:
            raise TranslateError(f"cannot read {path}: {describe(error)}") from None
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise TranslateError(f"{path} cannot be read ({type(error).__name__}: {error}): move it away, or run "
                                 "translate tune again to write it") from None


def save(path: Path, payload: Dict[str, Any]) -> None:
    """Write the dict torch.save writes (Checkpoint.payload) atomically and on disk
    (paths.atomic_write): a failed write (a full disk, a file-size limit) leaves the previous file
    as it was, and says so."""
    missing = [key for key in REQUIRED if key not in payload]
    if missing:
        raise ValueError(f"checkpoint payload lacks {missing}")
    with paths.atomic_write(path, binary=True, sync=True) as file:
        torch.save(payload, file)


def load(path: Path) -> Dict[str, Any]:
    """The dict a checkpoint file holds (Checkpoint.load names its fields); any problem is one
    TranslateError line.

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


def _damaged(path: Path, error: Exception) -> TranslateError:
    reason = str(error).split(". ")[0].splitlines()[0].rstrip(".") if str(error).strip() else type(error).__name__
    return TranslateError(f"{path} cannot be read, it is damaged or truncated ({reason}); nothing was changed: "
                          "move it away, or use another checkpoint")


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


def prune(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest keep_last numbered checkpoints (and the settings tune chose for them)."""
    for path in paths.numbered_checkpoints(run_dir)[: -keep_last or None] if keep_last > 0 else []:
        path.unlink(missing_ok=True)
        GenerationSettings.beside(path).unlink(missing_ok=True)



def remove_unfinished(run_dir: Path) -> List[str]:
    """Delete the half-written checkpoints a training killed while saving left behind:
    paths.atomic_write's temporary files (.NAME.XXXXXXXX) of the checkpoints only a training
    writes (the last, the best, the numbered ones), never trusted, each as large as a whole
    checkpoint. For the holder of run_dir's lock: no other training writes them meanwhile.
    Returns the names deleted."""
    removed = []
    for path, name in paths.unfinished_writes(Path(run_dir), "checkpoint_*.pt"):
        step = name[len("checkpoint_"):-len(".pt")]
        if name in (paths.LAST_CHECKPOINT, paths.BEST_CHECKPOINT) or step.isdigit():
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return sorted(removed)
