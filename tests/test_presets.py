"""The Multi30k presets train, decode and score end to end (a few updates on the dev split, so
that it takes seconds): the published recipe (config=multi30k_wu2021); ours (config=multi30k) joins
PRESETS once the dev sweep has chosen it.
What they reach in their minutes: scripts/bench_multi30k.py, docs/results.md."""

import json

import pytest

from tests.conftest import MULTI30K, need, run_cli

PRESETS = ["multi30k_wu2021"]


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
