"""The Multi30k presets train, decode and score end to end (a few updates on the dev split, so
that it takes seconds): the published recipe (config=multi30k_wu2021), ours (config=multi30k),
which is the dev sweep's winner as the sweep trained it, and ours for the literature's score
(config=multi30k_lowercase).
What they reach in their minutes: scripts/bench_multi30k.py, docs/results.md."""

import json
from pathlib import Path

import pytest

from tests.conftest import MULTI30K, need, run_cli, script_module

# In make test-slow, to keep the default suite under 10 minutes (on an AVX2 Zen 1 too): the published recipe, whose
# code paths ours runs; config=multi30k (cased) and config=multi30k_en_fr_lowercase, whose chain is
# config=multi30k_lowercase's on cased text and on French (composed in the default suite: below, and in
# tests/test_frozen_presets.py).
SLOW = pytest.mark.slow
PRESETS = [pytest.param("multi30k_wu2021", marks=SLOW), pytest.param("multi30k", marks=SLOW), "multi30k_lowercase",
           pytest.param("multi30k_en_fr_lowercase", marks=SLOW)]


@pytest.mark.parametrize("preset", PRESETS)
def test_a_multi30k_preset_trains_decodes_and_scores(tmp_path, cache, preset):
    need(MULTI30K)
    overrides = [f"config={preset}", "data.train_split=validation", "data.vocab_size=603", "train.max_steps=3", "valid.bleu_sentences=10",
                 "train.precision=fp32", f"run_dir={tmp_path}/run", f"data.cache_dir={cache}"]
    run_cli("train", *overrides, check=True)
    sources, references = tmp_path / "in.en", tmp_path / "ref.de"
    sources.write_text("A dog runs on the grass.\nTwo men are talking.\n", encoding="utf-8")
    references.write_text("Ein Hund läuft auf dem Gras.\nZwei Männer unterhalten sich.\n", encoding="utf-8")
    run_cli("decode", *overrides, f"decode.input={sources}", f"decode.output={tmp_path}/out.de", check=True)
    report = json.loads(run_cli("bleu", *overrides, f"bleu.hyp={tmp_path}/out.de", f"bleu.ref={references}",
                                "bleu.format=json", check=True).stdout)
    assert report["literature"] == "lowercased_tokenized_bleu" and report["lines"] == 2
    # A preset of lowercased text learns, writes and is scored in lowercase; a cased one keeps case.
    import sentencepiece

    from translate.checkpoint import Checkpoint

    saved = Checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")
    pieces = sentencepiece.SentencePieceProcessor(model_proto=saved.sentencepiece)
    cased_pieces = [p for p in map(pieces.id_to_piece, range(pieces.get_piece_size())) if p != p.lower()]
    # The test split, data.lowercase unset as a user may leave it: the model's own text is lowercase.
    run_cli("decode", *overrides, "data.lowercase=false", "decode.max_len_b=2", "decode.beam_size=1", "checkpoint.average_last=0", check=True)
    tgt = "fr" if "_en_fr" in preset else "de"
    references = (tmp_path / "run" / "decode" / f"test.{tgt}.ref").read_text(encoding="utf-8")
    outputs = (tmp_path / "out.de").read_text(encoding="utf-8") + (tmp_path / "run" / "decode" / f"test.{tgt}").read_text(encoding="utf-8")
    assert saved.languages == ["en", tgt]
    if preset.endswith("_lowercase"):
        assert saved.lowercase and not cased_pieces and outputs == outputs.lower() and references == references.lower()
    else:
        assert not saved.lowercase and cased_pieces and references != references.lower()


def test_ours_is_what_the_sweep_chose(compose, monkeypatch):
    """config=multi30k learns as the sweep's "literature-fairseq-init" candidate (config=tiny and its
    overrides) did: the same model, optimizer, schedule and batches. Only the checkpoints'
    cadence (minutes, not a tenth of a fixed number of updates) and the search differ."""
    scripts = Path(__file__).parents[1] / "scripts"
    monkeypatch.syspath_prepend(str(scripts))  # as when it runs: its neighbours import
    sweep = script_module("sweep_multi30k")
    ours, chosen = compose("train", "config=multi30k"), compose("train", "config=tiny", *sweep.CANDIDATES["literature-fairseq-init"])
    assert ours.model == chosen.model and ours.optim == chosen.optim and ours.data == chosen.data
    assert ours.train.tokens_per_batch == chosen.train.tokens_per_batch
    assert ours.train.tokens_per_update == chosen.train.tokens_per_update
    assert ours.train.label_smoothing == chosen.train.label_smoothing and ours.train.init == chosen.train.init
    assert (ours.train.max_minutes, ours.checkpoint.average_last, ours.decode.beam_size) == (60, 3, 5)


def test_ours_for_the_literature_score_is_the_three_hours_command(compose):
    """config=multi30k_lowercase is config=multi30k with the overrides the three seeds of
    docs/results.md trained with, and the published average of the last 10 epoch checkpoints."""
    hours = ["data.lowercase=true", "optim.decay=linear", "checkpoint.every_minutes=null", "checkpoint.every_epochs=1",
             "checkpoint.keep_last=10", "checkpoint.average_last=10"]
    preset, overridden = compose("train", "config=multi30k_lowercase"), compose("train", "config=multi30k", *hours)
    assert preset.model == overridden.model and preset.optim == overridden.optim and preset.data == overridden.data
    assert preset.train == overridden.train and preset.checkpoint == overridden.checkpoint and preset.decode == overridden.decode
    assert preset.data.lowercase and preset.optim.decay.name == "linear" and preset.checkpoint.by_epochs_alone
    assert (preset.checkpoint.keep_last, preset.checkpoint.average_last, preset.train.max_minutes) == (10, 10, 60)


@pytest.mark.parametrize("preset, base", [("multi30k_en_fr", "multi30k"), ("multi30k_en_fr_lowercase", "multi30k_lowercase")])
def test_the_en_fr_presets_are_the_en_de_recipes_on_french(compose, preset, base):
    """config=multi30k_en_fr(_lowercase) is the EN-DE preset as it is, on Multi30k's fr-en pair:
    only where the data is and which language it translates into differ."""
    import dataclasses

    french, german = compose("train", f"config={preset}"), compose("train", f"config={base}")
    assert (french.data.name, french.data.src_lang, french.data.tgt_lang) == ("fr-en", "en", "fr")
    assert dataclasses.replace(french.data, name=german.data.name, tgt_lang=german.data.tgt_lang) == german.data
    for section in ("model", "optim", "train", "checkpoint", "valid", "decode"):
        assert getattr(french, section) == getattr(german, section), section


def test_the_fitted_warmup_preset_trains_as_the_frozen_one_where_its_hour_reaches_the_warmup(compose):
    """config=multi30k_lowercase_fitted_warmup is config=multi30k_lowercase with the warmup cut
    to 72.2% of a time limit's projected updates, peaking at full * (share)^0.5. An hour projected
    (at update 50, as train.max_minutes does) to reach 2,770 updates or more keeps every rate of the
    frozen preset; the Zen 3's 1-thread hour (1,337 projected) ends its warmup at update 965, at the
    rate its log named (0.00347308), and falls to zero at the projection."""
    import torch

    from translate.training.optim import build_optimizer

    fitted, frozen = compose("train", "config=multi30k_lowercase_fitted_warmup"), compose("train", "config=multi30k_lowercase")
    assert (fitted.optim.warmup_ratio, fitted.optim.cut_peak_power) == (0.722, 0.5)
    for section in ("model", "data", "train", "checkpoint", "valid", "decode"):
        assert getattr(fitted, section) == getattr(frozen, section), section

    def hour(cfg, projected):  # train's schedule as a time limit sets it: the cut at update 50, the line's end at the warmup's
        _, schedule = build_optimizer(torch.nn.Linear(1, 1), cfg.optim, d_model=cfg.model.d_model, last_update=cfg.train.max_steps)
        if schedule.cuttable(50):
            schedule.cut_warmup(projected, 50)
        schedule.end_at(projected)
        return schedule

    for projected in (2770, 4500):
        a, b = hour(fitted, projected), hour(frozen, projected)
        assert a.warmup == 2000 and [a.rate_at(n) for n in range(1, projected + 2)] == [b.rate_at(n) for n in range(1, projected + 2)]
    slow, climbing = hour(fitted, 1337), hour(frozen, 1337)
    assert slow.warmup == 965 and slow.rate_at(965) == pytest.approx(0.00347308, rel=1e-6) and slow.rate_at(1338) == 0
    assert slow.rate_at(50) == climbing.rate_at(50) and climbing.rate_at(1337) > slow.rate_at(1200)
