"""The data report of a token cache (report.json in its folder, copied to run_dir as
data_report.json): what cleaning kept of each split, its tokens, the vocabulary, and each file of
the folder with its size and checksum. Written last, it marks the folder complete.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

from translate.core.errors import DamagedCache
from translate.core.json_fields import FieldError, JsonObject

REPORT = "report.json"  # written last: marks a folder complete


@dataclass(kw_only=True)
class SplitCounts(JsonObject):
    """One encoded split: pairs read and kept, those dropped by their first reason (the
    training split alone is cleaned), and its tokens, unknown ones among them."""

    pairs: int = 0
    kept: int = 0
    empty: int = 0  # a side without a token
    too_long: int = 0  # a side over data.max_length tokens
    ratio: int = 0  # sides more than data.max_length_ratio apart
    tokens_src: int = 0
    tokens_tgt: int = 0
    unk_src: int = 0
    unk_tgt: int = 0


@dataclass(kw_only=True)
class TestOverlap(JsonObject):
    """Test sentences also found, as they are, among the training sentences."""

    sentences: int  # of the test split
    source: int
    target: int


@dataclass(kw_only=True)
class FileRecord(JsonObject):
    bytes: int
    xxh3_64: str  # the checksum, hex


@dataclass(kw_only=True)
class DataReport(JsonObject):
    vocab_size: int
    specials: Dict[str, int]  # the ids of pad, unk, bos, eos (Specials.as_dict)
    dtype: str  # of the token files: uint16, or int32 for a larger vocabulary
    settings: Dict[str, Any]  # the DataConfig it was prepared with
    train: SplitCounts
    valid: Optional[SplitCounts] = None  # where the data has a dev split
    coverage: float  # the share of training tokens that are not unknown
    test_overlap: Optional[TestOverlap] = None  # where the data has a test split
    sampled: Optional[SplitCounts] = None  # data.bpe_dropout's segmentations of the kept training pairs, all together
    files: Dict[str, FileRecord]  # each file of the folder but the report

    @classmethod
    def load(cls, folder: Path) -> "DataReport":
        """The report of a cache folder; DamagedCache where it cannot be read."""
        try:
            return cls.from_json(json.loads((folder / REPORT).read_text()))
        except FieldError as error:
            raise DamagedCache(f"token cache {folder} is damaged: its {REPORT} cannot be read: {error}") from None
        except ValueError:
            raise DamagedCache(f"token cache {folder} is damaged: its {REPORT} cannot be read") from None

    def text(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    def save(self, folder: Path) -> None:
        """Into the folder, last: the folder is complete from then on."""
        (folder / REPORT).write_text(self.text())

    def summary(self) -> str:
        """One readable paragraph."""
        train = self.train
        dropped = f"{train.empty:,} empty, {train.too_long:,} too long, {train.ratio:,} ratio"
        line = (f"training pairs: {train.pairs:,} read, {train.kept:,} kept (dropped: {dropped}); "
                f"tokens: {train.tokens_src:,} source, {train.tokens_tgt:,} target; "
                f"vocabulary {self.vocab_size:,}, coverage {self.coverage:.4%}")
        if self.sampled is not None:
            copies = self.sampled.kept // max(1, train.kept)
            ratio = (self.sampled.tokens_src + self.sampled.tokens_tgt) / max(1, copies * (train.tokens_src + train.tokens_tgt))
            line += (f"; BPE-dropout {self.settings.get('bpe_dropout')}: {copies} sampled segmentations, "
                     f"{ratio:.2f}x the tokens")
        overlap = self.test_overlap
        if overlap:
            line += (f"; test sentences also in training: {overlap.source:,} source, "
                     f"{overlap.target:,} target of {overlap.sentences:,}")
        return line
