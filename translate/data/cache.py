"""The token cache on disk: a corpus's encoded splits as flat token files (memory-mapped on
load) beside the vocabulary and a report, in a folder named by a fingerprint of everything that
determines them (data.preparation computes it and builds the folder).

A folder is built under a temporary name and renamed into place when complete (its report,
written last, marks it so), so an interrupted preparation leaves nothing that a later run
would trust; a file lock lets one process build while the others (torchrun) wait.
"""

from __future__ import annotations

import fcntl
import itertools
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from translate.core.errors import DamagedCache
from translate.data.report import REPORT, DataReport, FileRecord
from translate.data.vocabulary import Vocabulary

FORMAT_VERSION = 3  # 3: the report records each file's size and checksum
SIDES = ("src", "tgt")
VOCABULARY = "vocabulary.model"


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
        self.tokens = {side: 0 for side in SIDES}
        self.unknown = {side: 0 for side in SIDES}

    def add(self, side: str, sequences: List[List[int]]) -> None:
        lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
        flat = np.fromiter(itertools.chain.from_iterable(sequences), dtype=self.dtype, count=int(lengths.sum()))
        flat.tofile(self.files[side])
        self.lengths[side].append(lengths)
        self.tokens[side] += int(flat.size)
        self.unknown[side] += int(np.count_nonzero(flat == self.unk))

    def close(self) -> None:
        for side in SIDES:
            self.files[side].close()
            lengths = np.concatenate(self.lengths[side]) if self.lengths[side] else np.zeros(0, np.int64)
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            np.save(self.folder / f"{self.name}.{side}_offsets.npy", offsets)


def sampled_split(copy: int) -> str:
    """The name of the training split's sampled segmentation number `copy` (data.bpe_dropout)."""
    return f"train_sampled{copy}"


@dataclass
class PreparedData:
    """What training needs: the vocabulary and the encoded splits."""

    folder: Path
    vocabulary: Vocabulary
    train: EncodedSplit  # the deterministic segmentation (what decoding sees)
    valid: Optional[EncodedSplit]
    report: DataReport
    # data.bpe_dropout's sampled segmentations of the same pairs, in the same order; none when off
    train_sampled: List[EncodedSplit] = field(default_factory=list)

    def training_split(self, epoch: int) -> EncodedSplit:
        """What epoch `epoch` (from 0) trains on: its sampled segmentation, taken in turn, else the one."""
        return self.train_sampled[epoch % len(self.train_sampled)] if self.train_sampled else self.train

    def training_lengths(self) -> List[Tuple[np.ndarray, np.ndarray]]:
        """Source and target lengths of each segmentation that training_split takes in turn."""
        return [(split.src_lengths, split.tgt_lengths) for split in (self.train_sampled or [self.train])]


def is_complete(folder: Path) -> bool:
    """Whether the folder holds a whole cache (its report is written last)."""
    return (folder / REPORT).is_file()


@contextmanager
def exclusive(folder: Path) -> Iterator[None]:
    """An exclusive file lock beside the cache folder (works across processes and nodes)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def file_records(folder: Path) -> Dict[str, FileRecord]:
    """Each file of a cache folder but its report: its size in bytes and its xxh3-64 checksum
    (a pass over the files at memory speed: about 0.1 s for a 1M-pair cache)."""
    return {path.name: FileRecord(bytes=path.stat().st_size, xxh3_64=_checksum(path))
            for path in sorted(folder.iterdir()) if path.is_file() and path.name != REPORT}


def _checksum(path: Path) -> str:
    import xxhash

    digest = xxhash.xxh3_64()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(folder: Path, report: DataReport) -> None:
    """Every file the report records is there with its size and checksum: else DamagedCache,
    naming the folder and the first file that differs (a cut, a damaged byte, a missing file)."""
    if not report.files:
        raise DamagedCache(f"token cache {folder} is damaged: its report records no files")
    for name, record in report.files.items():
        path = folder / name
        if not path.is_file():
            raise DamagedCache(f"token cache {folder} is damaged: {name} is missing")
        size = path.stat().st_size
        if size != record.bytes:
            raise DamagedCache(f"token cache {folder} is damaged: {name} has {size:,} bytes, its report says "
                               f"{record.bytes:,}")
        if _checksum(path) != record.xxh3_64:
            raise DamagedCache(f"token cache {folder} is damaged: {name} does not match its checksum")


def load(folder: Path) -> PreparedData:
    """The vocabulary and encoded splits of a complete cache folder, verified against its report
    first (DamagedCache where they differ: nothing is trained on a cache that does not match)."""
    report = DataReport.load(folder)
    verify(folder, report)
    vocabulary = Vocabulary((folder / VOCABULARY).read_bytes())
    valid = EncodedSplit.load(folder, "valid", report.dtype) if report.valid is not None else None
    copies = report.settings.get("bpe_dropout_copies", 0) if report.sampled is not None else 0
    sampled = [EncodedSplit.load(folder, sampled_split(k), report.dtype) for k in range(copies)]
    return PreparedData(folder, vocabulary, EncodedSplit.load(folder, "train", report.dtype), valid, report, sampled)
