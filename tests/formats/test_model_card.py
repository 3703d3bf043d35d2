"""The transformers export's model card (translate.formats.model_card), from the run record
(translate.core.run_record) that train and bleu keep."""

import pytest

from tests.conftest import run_cli, run_dir_of

pytest.importorskip("transformers", reason="the transformers extra is not installed")


def test_run_record_and_model_card(foreign_run, tmp_path):
    """train keeps the run record (updates, compute, validation, the command), bleu adds its
    scores with their signatures, and the export's model card shows them."""
    from translate.core.run_record import RunRecord

    run_cli("decode", *foreign_run, "decode.beam_size=1", check=True)
    run_cli("bleu", *foreign_run, check=True)
    record = RunRecord.load(run_dir_of(foreign_run))
    assert record.training.updates == 250 and record.training.model_flops > 0
    assert record.data.train_pairs_kept == 1014 and record.data.vocabulary.specials["pad"] == 600
    assert record.commands[0].startswith("translate train config=tiny")
    [score] = record.scores
    assert score.hyp == "decode/test.de" and "version:2.6.0" in score.scores["sacrebleu"]["signature"]
    run_cli("export", *foreign_run, "export.format=transformers", f"export.output={tmp_path / 'hf'}", check=True)
    card = (tmp_path / "hf" / "README.md").read_text(encoding="utf-8")
    for fragment in ("language: [en, de]", "1,014 training pairs after cleaning", "601 ids", "250 updates",
                     f"sacreBLEU {score.sacrebleu:.2f}", score.scores["sacrebleu"]["signature"],
                     record.commands[0], "translate decode config=tiny", f"{record.model.parameters:,} parameters"):
        assert fragment in card, fragment


def test_a_model_of_lowercased_text_tells_its_users_to_lowercase():
    """A checkpoint trained with data.lowercase: the card's example lowercases its input and
    says why; a cased model's card says nothing of it."""
    from translate.core.config import DecodeConfig
    from translate.core.run_record import RunRecord
    from translate.formats.model_card import model_card

    cased, lowered = (model_card(RunRecord(), ["en", "de"], 100, 1000, DecodeConfig(), longest_source=10, lowercase=lowercase)
                      for lowercase in (False, True))
    assert '"A sentence to translate.".lower()' in lowered and "trained on lowercased text" in lowered
    assert ".lower()" not in cased and "lowercased" not in cased
