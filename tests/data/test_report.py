"""The data report of a token cache (translate.data.report): the same file read and written
again (a cache folder stays valid), its summary line, and a report that does not fit."""

from __future__ import annotations

import json

import pytest

from translate.core.errors import DamagedCache
from translate.data.report import REPORT, DataReport

COUNTS = {"pairs": 10, "kept": 7, "empty": 1, "too_long": 1, "ratio": 1, "tokens_src": 70, "tokens_tgt": 80,
          "unk_src": 1, "unk_tgt": 2}
# As preparation writes one: the dev split and the test overlap where the data has them, the files last.
REPORT_JSON = {"vocab_size": 603, "specials": {"pad": 0, "unk": 1, "bos": 2, "eos": 3}, "dtype": "uint16",
               "settings": {"path": "/data/multi30k", "spm_model": None}, "train": COUNTS,
               "valid": {**COUNTS, "empty": 0, "too_long": 0, "ratio": 0}, "coverage": 0.98,
               "test_overlap": {"sentences": 20, "source": 3, "target": 4},
               "files": {"train.src_tokens.bin": {"bytes": 140, "xxh3_64": "0123456789abcdef"}}}


def test_a_report_read_and_written_again_is_the_same_file(tmp_path):
    text = json.dumps(REPORT_JSON, indent=2)
    (tmp_path / REPORT).write_text(text)
    report = DataReport.load(tmp_path)
    assert (report.train.kept, report.valid.pairs, report.files["train.src_tokens.bin"].bytes) == (7, 10, 140)
    report.save(tmp_path)
    assert (tmp_path / REPORT).read_text() == text
    without = {key: value for key, value in REPORT_JSON.items() if key not in ("valid", "test_overlap")}
    assert DataReport.from_json(without).to_json() == without  # parts the data lacks stay out
    assert report.summary() == ("training pairs: 10 read, 7 kept (dropped: 1 empty, 1 too long, 1 ratio); tokens: 70 "
                                "source, 80 target; vocabulary 603, coverage 98.0000%; test sentences also in "
                                "training: 3 source, 4 target of 20")


def test_a_report_that_does_not_fit_is_a_damaged_cache(tmp_path):
    (tmp_path / REPORT).write_text(json.dumps({**REPORT_JSON, "train": {"pairs": 10, "kept": "seven"}}))
    with pytest.raises(DamagedCache, match=f"token cache {tmp_path} is damaged: its {REPORT} cannot be read: "
                                     "train.kept is not a whole number"):
        DataReport.load(tmp_path)
