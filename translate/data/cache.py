"""The encoded corpus on disk, keyed by a fingerprint of the data and vocabulary settings.

`prepare` cleans the training split, trains the vocabulary (or takes data.spm_model) and
encodes the training and dev splits once, streaming in chunks to flat token files; a second
run with the same settings maps them at once. A folder is built under a temporary name and
renamed into place when complete, so an interrupted preparation leaves nothing that a later
run would trust; a file lock lets one process prepare while the others (torchrun) wait.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import numpy as np

from translate.config import DataConfig, TranslateConfig
from translate.data.loading import ParallelCorpus, load_corpus
from translate.data.progress import Progress
from translate.data.vocabulary import Vocabulary
from translate.errors import MissingSplit, TranslateError

FORMAT_VERSION = 2
SIDES = ("src", "tgt")
REPORT = "report.json"


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

    @classmethod
    def load(cls, folder: Path, name: str, dtype: str) -> "EncodedSplit":
        """Memory-map the token files: nothing is read until a batch needs it."""
        arrays = {}
        for side in SIDES:
            tokens = folder / f"{name}.{side}_tokens.bin"
            size = tokens.stat().st_size
            arrays[f"{side}_tokens"] = np.memmap(tokens, dtype=dtype, mode="r") if size else np.zeros(0, dtype)
            arrays[f"{side}_offsets"] = np.load(folder / f"{name}.{side}_offsets.npy", mmap_mode="r")
        return cls(**arrays)


class SplitWriter:
    """Appends encoded sentences to flat token files, chunk by chunk (bounded memory)."""

    def __init__(self, folder: Path, name: str, dtype: np.dtype, unk: int):
        self.folder, self.name, self.dtype, self.unk = folder, name, dtype, unk
        self.files = {side: open(folder / f"{name}.{side}_tokens.bin", "wb") for side in SIDES}
        self.lengths: Dict[str, List[np.ndarray]] = {side: [] for side in SIDES}
        self.counts = {"tokens_src": 0, "tokens_tgt": 0, "unk_src": 0, "unk_tgt": 0}

    def add(self, side: str, sequences: List[List[int]]) -> None:
        lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
        flat = np.fromiter(itertools.chain.from_iterable(sequences), dtype=self.dtype, count=int(lengths.sum()))
        flat.tofile(self.files[side])
        self.lengths[side].append(lengths)
        self.counts[f"tokens_{side}"] += int(flat.size)
        self.counts[f"unk_{side}"] += int(np.count_nonzero(flat == self.unk))

    def close(self) -> None:
        for side in SIDES:
            self.files[side].close()
            lengths = np.concatenate(self.lengths[side]) if self.lengths[side] else np.zeros(0, np.int64)
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            np.save(self.folder / f"{self.name}.{side}_offsets.npy", offsets)


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
        "max_length": data.max_length,
        "max_length_ratio": data.max_length_ratio,
    }
    if data.spm_model:  # a given model replaces every vocabulary setting
        model = _read_spm_model(data.spm_model)
        settings["spm_model"] = hashlib.sha256(model).hexdigest()
        settings["specials"] = Vocabulary(model).specials.as_dict()  # how its special pieces are used
    else:
        settings.update(vocab_size=data.vocab_size, vocab_type=data.vocab_type, vocab_sample=data.vocab_sample)
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def prepare(data: DataConfig, log=print) -> PreparedData:
    """Load the encoded corpus from the cache, building it first if needed."""
    train = load_corpus(data, data.train_split)
    if len(train) == 0:
        raise TranslateError(f"{train.description} is empty")
    valid = _optional_split(data, data.valid_split)
    key = fingerprint(data, train, valid)
    folder = Path(data.cache_dir) / key
    if not (folder / REPORT).is_file():
        with _exclusive(folder):  # one process builds; the others wait here, then load
            if not (folder / REPORT).is_file():
                log(f"preparing {train.description}: {len(train):,} pairs -> {folder}")
                _build(folder, data, train, valid, log)
    else:
        log(f"using cached corpus {folder}")
    return _load(folder)


def prepare_verb(cfg: TranslateConfig) -> Path:
    """`translate prepare`: build (or find) the cache and put its data report in run_dir."""
    data = prepare(cfg.data, log=logging.getLogger("translate.prepare").info)
    destination = Path(cfg.run_dir) / "data_report.json"
    write_report(data, destination)
    print(summary(data.report) + f"\nreport: {destination}  cache: {data.folder}")
    return destination


def write_report(data: PreparedData, destination: Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_text(json.dumps(data.report, indent=2) + "\n", encoding="utf-8")


def summary(report: Dict) -> str:
    """One readable paragraph of the data report."""
    train = report["train"]
    dropped = ", ".join(f"{train[k]:,} {k.replace('_', ' ')}" for k in ("empty", "too_long", "ratio"))
    line = (f"training pairs: {train['pairs']:,} read, {train['kept']:,} kept (dropped: {dropped}); "
            f"tokens: {train['tokens_src']:,} source, {train['tokens_tgt']:,} target; "
            f"vocabulary {report['vocab_size']:,}, coverage {report['coverage']:.4%}")
    overlap = report.get("test_overlap")
    if overlap:
        line += (f"; test sentences also in training: {overlap['source']:,} source, "
                 f"{overlap['target']:,} target of {overlap['sentences']:,}")
    return line


def _optional_split(data: DataConfig, split: str) -> Optional[ParallelCorpus]:
    """The split if the data has it (dev and test sets are optional for training)."""
    try:
        return load_corpus(data, split)
    except MissingSplit:
        return None


@contextmanager
def _exclusive(folder: Path) -> Iterator[None]:
    """An exclusive file lock beside the cache folder (works across processes and nodes)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_spm_model(path: str) -> bytes:
    file = Path(path)
    if not file.is_file():
        raise TranslateError(f"missing sentencepiece model: {path}")
    return file.read_bytes()


def _build(folder: Path, data: DataConfig, train: ParallelCorpus, valid: Optional[ParallelCorpus], log) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        if data.spm_model:
            vocabulary = Vocabulary(_read_spm_model(data.spm_model))
        else:
            vocabulary = Vocabulary.train(_both_sides(train), data.vocab_size, data.vocab_type, sample_size=data.vocab_sample)
        (staging / "vocabulary.model").write_bytes(vocabulary.model_bytes)
        dtype = np.dtype(np.uint16 if len(vocabulary) <= np.iinfo(np.uint16).max else np.int32)
        report: Dict = {"vocab_size": len(vocabulary), "specials": vocabulary.specials.as_dict(), "dtype": dtype.name,
                        "settings": asdict(data)}
        test = _optional_split(data, "test")
        test_sets = _sentence_sets(test) if test is not None else None
        report["train"], overlap = _encode(train, vocabulary, staging, "train", dtype, data, clean=True, test_sets=test_sets,
                                           log=log)
        if report["train"]["kept"] == 0:
            raise TranslateError(f"{train.description}: no pair left after cleaning")
        if valid is not None:
            report["valid"], _ = _encode(valid, vocabulary, staging, "valid", dtype, data, clean=False)
        train_tokens = report["train"]["tokens_src"] + report["train"]["tokens_tgt"]
        report["coverage"] = 1 - (report["train"]["unk_src"] + report["train"]["unk_tgt"]) / max(1, train_tokens)
        if test_sets is not None:
            report["test_overlap"] = {"sentences": len(test), **overlap}
        (staging / REPORT).write_text(json.dumps(report, indent=2))  # last: marks the folder complete
        if folder.exists():  # a stale incomplete folder from an older version: replace it
            shutil.rmtree(folder)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log(summary(report))


def _both_sides(corpus: ParallelCorpus) -> Iterator[str]:
    for src, tgt in corpus.chunks():
        yield from itertools.chain.from_iterable(zip(src, tgt))


def _sentence_sets(corpus: ParallelCorpus) -> Tuple[Set[str], Set[str]]:
    sources, targets = corpus.pairs()
    return {s.strip() for s in sources}, {t.strip() for t in targets}


def _encode(
    corpus: ParallelCorpus,
    vocabulary: Vocabulary,
    folder: Path,
    name: str,
    dtype: np.dtype,
    data: DataConfig,
    clean: bool,
    test_sets: Optional[Tuple[Set[str], Set[str]]] = None,
    log=None,
) -> Tuple[Dict, Dict]:
    """Encode chunk by chunk into folder/name.*; training pairs with an empty side, a side over
    data.max_length tokens, or sides more than data.max_length_ratio apart are dropped."""
    writer = SplitWriter(folder, name, dtype, vocabulary.specials.unk)
    counts = {"pairs": 0, "kept": 0, "empty": 0, "too_long": 0, "ratio": 0}
    overlap = {"source": 0, "target": 0}
    progress = Progress(len(corpus), f"encoding {name}", log) if log is not None else None
    for src, tgt in corpus.chunks(20000):
        if test_sets is not None:
            overlap["source"] += sum(s.strip() in test_sets[0] for s in src)
            overlap["target"] += sum(t.strip() in test_sets[1] for t in tgt)
        src_ids, tgt_ids = vocabulary.encode(src), vocabulary.encode(tgt)
        counts["pairs"] += len(src_ids)
        if clean:
            keep = _clean(src_ids, tgt_ids, data, counts)
            src_ids = [ids for ids, k in zip(src_ids, keep) if k]
            tgt_ids = [ids for ids, k in zip(tgt_ids, keep) if k]
        counts["kept"] += len(src_ids)
        writer.add("src", src_ids)
        writer.add("tgt", tgt_ids)
        if progress is not None:
            progress.update(counts["pairs"] - progress.done)
    if progress is not None:
        progress.close()
    writer.close()
    counts.update(writer.counts)
    return counts, overlap


def _clean(src_ids: List[List[int]], tgt_ids: List[List[int]], data: DataConfig, counts: Dict) -> np.ndarray:
    """Which pairs of a chunk to keep; counts the dropped ones by their first reason."""
    src_len = np.fromiter(map(len, src_ids), dtype=np.int64, count=len(src_ids))
    tgt_len = np.fromiter(map(len, tgt_ids), dtype=np.int64, count=len(tgt_ids))
    empty = (src_len == 0) | (tgt_len == 0)
    too_long = ~empty & (np.maximum(src_len, tgt_len) > data.max_length)
    ratio = np.zeros_like(empty)
    if data.max_length_ratio > 0:
        longer, shorter = np.maximum(src_len, tgt_len), np.maximum(np.minimum(src_len, tgt_len), 1)
        ratio = ~empty & ~too_long & (longer > data.max_length_ratio * shorter)
    counts["empty"] += int(empty.sum())
    counts["too_long"] += int(too_long.sum())
    counts["ratio"] += int(ratio.sum())
    return ~(empty | too_long | ratio)


def _load(folder: Path) -> PreparedData:
    report = json.loads((folder / REPORT).read_text())
    vocabulary = Vocabulary((folder / "vocabulary.model").read_bytes())
    valid = EncodedSplit.load(folder, "valid", report["dtype"]) if "valid" in report else None
    return PreparedData(folder, vocabulary, EncodedSplit.load(folder, "train", report["dtype"]), valid, report)
