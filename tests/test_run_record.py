"""The run record (translate.core.run_record) as typed classes (translate.core.json_fields): a
record read and written again is the same file, tune's entries kept; a part that does not fit
is one line; the questions asked of it (the compute a resume adds to, the test score)."""

from __future__ import annotations

import json

import pytest

from translate.core import run_record
from translate.core.errors import TranslateError
from translate.core.run_record import RunRecord, Score

# As train, tune and bleu write one: the parts in the order they came, tune's entries (which
# RunRecord does not name) between train's and bleu's, a null kept.
RECORD = {
    "settings": {"data": {"tgt_lang": "de"}, "decode": {"split": "test"}},
    "data": {"source": "/data/multi30k", "name": "de-en", "languages": ["en", "de"], "train_pairs": 1014,
             "train_pairs_kept": 1014, "train_tokens": {"source": 23970, "target": 26767},
             "vocabulary": {"size": 603, "given": None, "specials": {"pad": 0, "unk": 1, "bos": 2, "eos": 3}}},
    "model": {"parameters": 40832, "d_model": 32, "d_ff": 64, "heads": 2, "layers": 1, "d_k": None},
    "training": {"updates": 4, "seconds": 14.978300725999816, "model_flops": 1428599951.8708715, "target_tokens": 5587,
                 "skipped_updates": 0, "device": "cpu", "processes": 1, "precision": "fp32"},
    "commands": ["translate train config=tiny train.max_steps=2", "translate train config=tiny train.max_steps=4"],
    "valid": {"update": 4, "loss": 6.2796201695290845, "nll": 6.218964296430676, "bleu": 0.10149854567909884},
    "target": {"target_bleu": 0.0, "bleu": 0.0858, "update": 2, "process_seconds": 15.99, "training_seconds": 11.2,
               "target_tokens": 2832, "model_flops": 724144453.8568656},
    "length_penalty": {"alpha": 1.0},
    "length_penalties": {"checkpoint_last.pt": {"alpha": 1.0}},
    "scores": [{"hyp": "decode/test.de", "lines": 1000, "variant": "wmt14", "scores": {"sacrebleu": {"value": 0.1}},
                "text": "sacreBLEU 0.10"}],
}


def written(record) -> str:
    return json.dumps(record, indent=2, ensure_ascii=False) + "\n"


def test_a_record_read_and_written_again_is_the_same_file(tmp_path):
    path = tmp_path / "run_record.json"
    path.write_text(written(RECORD), encoding="utf-8")
    record = RunRecord.load(tmp_path)
    assert record.training.updates == 4 and record.data.vocabulary.given is None and record.model.parameters == 40832
    assert record.others == {"length_penalty": {"alpha": 1.0}, "length_penalties": {"checkpoint_last.pt": {"alpha": 1.0}}}
    record.save(tmp_path)
    assert path.read_text(encoding="utf-8") == written(RECORD)


def test_a_new_score_replaces_that_of_the_same_file_and_keeps_the_rest(tmp_path):
    run_record.save(tmp_path, RECORD)
    run_record.record_score(tmp_path, Score(hyp="decode/test.de", lines=1000, variant="wmt14",
                                            scores={"sacrebleu": {"value": 27.5}}, text="sacreBLEU 27.50"))
    run_record.record_score(tmp_path, Score(hyp="sweep/dev.de", lines=1014, variant="dev",
                                            scores={"sacrebleu": {"value": 30.0}}, text="sacreBLEU 30.00"))
    record = run_record.load(tmp_path)
    assert list(record) == list(RECORD)  # every part where it was
    assert [score["hyp"] for score in record["scores"]] == ["decode/test.de", "sweep/dev.de"]
    assert RunRecord.load(tmp_path).test_bleu() == 27.5  # the test split's decode, not the sweep's dev one


def test_a_record_whose_part_does_not_fit_is_one_line(tmp_path):
    run_record.save(tmp_path, {**RECORD, "training": {"updates": 4}})
    with pytest.raises(TranslateError, match=r"run_record.json cannot be read: no training.seconds$"):
        RunRecord.load(tmp_path)
    run_record.save(tmp_path, {**RECORD, "valid": {"update": "four"}})
    with pytest.raises(TranslateError, match=r"cannot be read: valid.update is not a whole number$"):
        RunRecord.load(tmp_path)
    (tmp_path / "run_record.json").write_text("{ not JSON")
    assert RunRecord.load(tmp_path) == RunRecord()  # as none: train writes it afresh


def test_a_resume_adds_to_the_compute_of_the_update_it_resumes(tmp_path):
    run_record.save(tmp_path, RECORD)
    totals = run_record.previous_training(tmp_path, 4)
    assert (totals.seconds, totals.model_flops, totals.target_tokens) == (14.978300725999816, 1428599951.8708715, 5587.0)
    assert run_record.previous_training(tmp_path, 3) == run_record.Compute()  # the record describes another update
    assert run_record.previous_training(tmp_path, None) == run_record.Compute()  # a fresh start
    uncounted = {key: value for key, value in RECORD["training"].items() if key != "target_tokens"}
    run_record.save(tmp_path, {**RECORD, "training": uncounted})
    assert run_record.previous_training(tmp_path, 4).target_tokens == 0.0
