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


def test_each_scoring_of_a_held_out_split_is_kept_and_counted(tmp_path):
    """A test split scored twice is on the record twice (the second is not hidden by replacing
    the first); a dev decode scored again replaces its earlier score, as before."""
    run_record.save(tmp_path, RECORD)  # its one score: recorded before scorings were dated, split unknown

    def score(hyp, split, value):
        return Score(hyp=hyp, lines=1000, variant="wmt14", scores={"sacrebleu": {"value": value}}, text="",
                     scored_at="2026-12-04T17:00:00+00:00", split=split, held_out=split != "validation")

    for value in (27.5, 28.0):
        run_record.record_score(tmp_path, score("decode/test.de", "test", value))
        run_record.record_score(tmp_path, score("sweep/dev.de", "validation", value + 3))
    record = RunRecord.load(tmp_path)
    assert [(s.hyp, s.sacrebleu) for s in record.scores] == [("decode/test.de", 0.1), ("decode/test.de", 27.5),
                                                            ("decode/test.de", 28.0), ("sweep/dev.de", 31.0)]
    assert len(record.test_scorings()) == 3 and record.test_bleu() == 28.0  # the old record's scoring counts too
    elsewhere = score("tests/test-beam5.de", "test", 29.0)  # the test split decoded to a file of its own name
    run_record.record_score(tmp_path, elsewhere)
    assert len(RunRecord.load(tmp_path).test_scorings()) == 4


def test_decode_writes_what_it_decoded_and_bleu_records_it(trained_run, tmp_path):
    """decode's output has beside it the checkpoint, its weights, the search and the machine;
    bleu puts them in the record with the date, the split and the scores; a second scoring of
    the test split is counted; a dev decode is not a test scoring; a changed output is not
    described by decode's record any longer."""
    import datetime

    from tests.conftest import run_cli, run_dir_of
    from translate.checkpoint import Checkpoint
    from translate.core.precision import cpu_model

    run = run_dir_of(trained_run)
    run_record.save(run, {key: value for key, value in run_record.load(run).items() if key != "scores"})
    quick = ["decode.max_len_b=3", "decode.beam_size=2", "decode.length_penalty=0.8"]
    run_cli("decode", *trained_run, *quick, check=True)
    output = run / "decode" / "test.de"
    decoded = run_record.Decoded.read(output)
    identity = Checkpoint.load(run / "checkpoint_average.pt").identity()  # config=tiny averages the last ones
    assert decoded is not None and decoded.checkpoint == str(run / "checkpoint_average.pt") and decoded.split == "test"
    assert (decoded.weights.update, decoded.weights.fingerprint) == (identity.update, identity.fingerprint)
    assert decoded.weights.update == 30 and decoded.weights.averaged == list(identity.averaged) and identity.averaged
    assert (decoded.beam_size, decoded.length_penalty, decoded.length_penalty_origin) == (2, 0.8, "given on the command line")
    assert decoded.machine.cpu == cpu_model() and decoded.machine.isa in ("AVX512", "AVX2", "DEFAULT", "VSX", "ZVECTOR", "SVE256")
    assert decoded.commit and decoded.decode_precision == "fp32"
    for _ in range(2):
        run_cli("bleu", *trained_run, check=True)
    record = RunRecord.load(run)
    first, second = record.test_scorings()
    assert len(record.test_scorings()) == 2 and first.decoded == second.decoded == decoded
    assert first.split == "test" and first.held_out and first.literature == "lowercased_tokenized_bleu"  # Multi30k's papers'
    when = datetime.datetime.fromisoformat(second.scored_at)
    assert when.utcoffset() == datetime.timedelta(0) and abs(datetime.datetime.now(datetime.timezone.utc) - when).total_seconds() < 600

    dev = tmp_path / "dev.de"  # outside the run: never recorded
    run_cli("decode", *trained_run, *quick, "decode.split=validation", f"decode.output={run / 'sweep' / 'dev.de'}", check=True)
    for _ in range(2):
        run_cli("bleu", *trained_run, f"bleu.hyp={run / 'sweep' / 'dev.de'}", f"bleu.ref={run / 'sweep' / 'dev.de.ref'}",
                check=True)
    record = RunRecord.load(run)
    assert [s.split for s in record.scores] == ["test", "test", "validation"] and record.scores[-1].held_out is False
    assert not dev.exists()
    output.write_text(output.read_text(encoding="utf-8").upper(), encoding="utf-8")  # no longer decode's output
    run_cli("bleu", *trained_run, check=True)
    last = RunRecord.load(run).scores[-1]
    assert last.decoded is None and last.split == "test" and len(RunRecord.load(run).test_scorings()) == 3
