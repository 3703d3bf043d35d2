"""The encoded corpus on disk, keyed by a fingerprint of the data and vocabulary settings.

`prepare` trains the vocabulary and encodes the training and dev splits once; a second run
with the same settings maps the arrays at once. A folder is written under a temporary name
and renamed into place when complete, so an interrupted preparation leaves nothing that a
later run would trust.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from translate.config import DataConfig
from translate.data.loading import ParallelCorpus, load_corpus
from translate.data.vocabulary import Vocabulary
from translate.errors import TranslateError

FORMAT_VERSION = 1


@dataclass
class EncodedSplit:
    """Token ids of one split as flat arrays: sentence i is tokens[offsets[i]:offsets[i+1]]."""

    src_tokens: np.ndarray  # (total source tokens,) uint16 or int32, no BOS/EOS
    src_offsets: np.ndarray  # (sentences + 1,) int64
    tgt_tokens: np.ndarray
    tgt_offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    @property
    def src_lengths(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @property
    def tgt_lengths(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)

    def source(self, i: int) -> np.ndarray:
        return self.src_tokens[self.src_offsets[i] : self.src_offsets[i + 1]]

    def target(self, i: int) -> np.ndarray:
        return self.tgt_tokens[self.tgt_offsets[i] : self.tgt_offsets[i + 1]]

    def save(self, folder: Path, name: str) -> None:
        for field in ("src_tokens", "src_offsets", "tgt_tokens", "tgt_offsets"):
            np.save(folder / f"{name}.{field}.npy", getattr(self, field))

    @classmethod
    def load(cls, folder: Path, name: str) -> "EncodedSplit":
        arrays = {f: np.load(folder / f"{name}.{f}.npy", mmap_mode="r") for f in ("src_tokens", "src_offsets", "tgt_tokens", "tgt_offsets")}
        return cls(**arrays)


@dataclass
class PreparedData:
    """What training needs: the vocabulary and the encoded splits."""

    folder: Path
    vocabulary: Vocabulary
    train: EncodedSplit
    valid: Optional[EncodedSplit]
    report: Dict


def fingerprint(data: DataConfig, train: ParallelCorpus, valid: Optional[ParallelCorpus]) -> str:
    """Hash of everything that determines the cache's contents, and nothing else."""
    settings = {
        "format": FORMAT_VERSION,
        "train": train.fingerprint(),
        "valid": valid.fingerprint() if valid is not None else None,
        "src_lang": data.src_lang,
        "tgt_lang": data.tgt_lang,
        "vocab_size": data.vocab_size,
        "vocab_type": data.vocab_type,
        "vocab_sample": data.vocab_sample,
        "max_length": data.max_length,
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def prepare(data: DataConfig, log=print) -> PreparedData:
    """Load the encoded corpus from the cache, building it first if needed."""
    train = load_corpus(data, data.train_split)
    if len(train) == 0:
        raise TranslateError(f"{train.description} is empty")
    valid = _optional_valid(data)
    key = fingerprint(data, train, valid)
    folder = Path(data.cache_dir) / key
    if not (folder / "report.json").is_file():
        log(f"preparing {train.description}: {len(train):,} pairs -> {folder}")
        _build(folder, data, train, valid, log)
    else:
        log(f"using cached corpus {folder}")
    return _load(folder)


def _optional_valid(data: DataConfig) -> Optional[ParallelCorpus]:
    if data.path is None and data.valid is None:
        return None
    try:
        return load_corpus(data, data.valid_split)
    except TranslateError as error:
        if "has no split" in str(error):
            return None
        raise


def _build(folder: Path, data: DataConfig, train: ParallelCorpus, valid: Optional[ParallelCorpus], log) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        vocabulary = Vocabulary.train(
            _both_sides(train), data.vocab_size, data.vocab_type, sample_size=data.vocab_sample
        )
        (staging / "vocabulary.model").write_bytes(vocabulary.model_bytes)
        report: Dict = {"vocab_size": len(vocabulary), "settings": asdict(data)}
        encoded, report["train"] = _encode(train, vocabulary, data.max_length, clean=True)
        encoded.save(staging, "train")
        if valid is not None:
            encoded, report["valid"] = _encode(valid, vocabulary, data.max_length, clean=False)
            encoded.save(staging, "valid")
        if report["train"]["kept"] == 0:
            raise TranslateError(f"{train.description}: no pair left after cleaning")
        (staging / "report.json").write_text(json.dumps(report, indent=2))
        if folder.exists():  # another process finished the same preparation first
            shutil.rmtree(staging)
        else:
            os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log(f"vocabulary {len(vocabulary):,} pieces; kept {report['train']['kept']:,} training pairs")


def _both_sides(corpus: ParallelCorpus) -> Iterator[str]:
    for src, tgt in corpus.chunks():
        yield from itertools.chain.from_iterable(zip(src, tgt))


def _encode(corpus: ParallelCorpus, vocabulary: Vocabulary, max_length: int, clean: bool) -> Tuple[EncodedSplit, Dict]:
    """Encode in chunks. Training pairs with an empty side or a side over max_length are dropped."""
    dtype = np.uint16 if len(vocabulary) <= np.iinfo(np.uint16).max else np.int32
    sides: Dict[str, List[np.ndarray]] = {"src": [], "tgt": []}
    lengths: Dict[str, List[np.ndarray]] = {"src": [], "tgt": []}
    counts = {"pairs": 0, "kept": 0, "empty": 0, "too_long": 0}
    for src, tgt in corpus.chunks():
        src_ids, tgt_ids = vocabulary.encode(src), vocabulary.encode(tgt)
        counts["pairs"] += len(src_ids)
        keep = []
        for s, t in zip(src_ids, tgt_ids):
            if clean and (not s or not t):
                counts["empty"] += 1
            elif clean and max(len(s), len(t)) > max_length:
                counts["too_long"] += 1
            else:
                keep.append((s, t))
        counts["kept"] += len(keep)
        for side, column in (("src", 0), ("tgt", 1)):
            sequences = [pair[column] for pair in keep]
            lengths[side].append(np.fromiter((len(x) for x in sequences), dtype=np.int64, count=len(sequences)))
            sides[side].append(np.fromiter(itertools.chain.from_iterable(sequences), dtype=dtype))
    arrays = {}
    for side in ("src", "tgt"):
        all_lengths = np.concatenate(lengths[side]) if lengths[side] else np.zeros(0, np.int64)
        arrays[f"{side}_tokens"] = np.concatenate(sides[side]) if sides[side] else np.zeros(0, dtype)
        arrays[f"{side}_offsets"] = np.concatenate([[0], np.cumsum(all_lengths)]).astype(np.int64)
    counts["src_tokens"] = int(arrays["src_tokens"].size)
    counts["tgt_tokens"] = int(arrays["tgt_tokens"].size)
    return EncodedSplit(**arrays), counts


def _load(folder: Path) -> PreparedData:
    vocabulary = Vocabulary((folder / "vocabulary.model").read_bytes())
    valid = EncodedSplit.load(folder, "valid") if (folder / "valid.src_tokens.npy").is_file() else None
    report = json.loads((folder / "report.json").read_text())
    return PreparedData(folder, vocabulary, EncodedSplit.load(folder, "train"), valid, report)
