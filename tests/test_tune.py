"""The length penalty chosen on the dev split (translate.verbs.tune): what it writes beside the
checkpoint, and that decode, export and plot of those weights then use it unless told otherwise."""

import json
import logging
import re
import shutil
from pathlib import Path

import sacrebleu

import pytest
import torch

from tests.conftest import MULTI30K, run_cli, run_dir_of
from translate.checkpoint import Checkpoint, GenerationSettings, Identity
from translate.core import run_record
from translate.core.command_line import CommandLine
from translate.core.config import DecodeConfig, ModelConfig, to_plain
from translate.core.errors import TranslateError
from translate.model import Transformer
from translate.translator import Translator


def copy_of(trained_run, tmp_path):
    """The shared trained run's overrides, pointed at a copy of it (tune writes its record)."""
    run_dir = tmp_path / "run"
    shutil.copytree(run_dir_of(trained_run), run_dir)
    return [o for o in trained_run if not o.startswith("run_dir=")] + [f"run_dir={run_dir}"], run_dir


def write_weights(path: Path, seed: int, step: int, **fields) -> Checkpoint:
    """A small checkpoint of a model initialized from `seed`."""
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=16, d_ff=32, heads=2, layers=1, vocab_size=30)
    written = Checkpoint(Transformer(cfg).state_dict(), to_plain(cfg), b"spm", step, **fields)
    written.save(path)
    return written


def test_the_configurations_alpha_without_a_choice_the_tuned_one_with_it_the_command_lines_above_both():
    """Translator.decoding: the preset's (here the paper's 0.6) for weights tune chose none for,
    tune's for the weights it chose one for, and decode.length_penalty given on the command line,
    even the paper's value, above it."""
    tuned = GenerationSettings(1.2, 4, Identity(3), split="validation", sentences=10)
    plain, chosen = Translator(None, None), Translator(None, None, generation=tuned)
    assert plain.decoding(DecodeConfig()).settings.length_penalty == 0.6
    assert chosen.decoding(DecodeConfig()).settings.length_penalty == 1.2
    assert "chosen by translate tune on 10 sentences of the validation split" in chosen.decoding(DecodeConfig())[1]
    told = CommandLine.of("decode", ["decode.length_penalty=0.6"])
    assert chosen.decoding(DecodeConfig(), told) == (DecodeConfig(), "given on the command line")
    assert chosen.decoding(DecodeConfig(), CommandLine.of("decode", ["decode.beam_size=2"])).settings.length_penalty == 1.2


def test_the_tuned_settings_name_the_weights_as_decodes_record_does_and_older_files_still_read(tmp_path):
    """One JSON shape for weights ({update, averaged, fingerprint}: run_record.Weights, decode's
    record) in <checkpoint>.generation.json; a file that named the update "step" reads the same."""
    checkpoint = tmp_path / "checkpoint_7.pt"
    written = GenerationSettings(1.2, 4, Identity(7, ("checkpoint_6.pt", "checkpoint_7.pt"), "ab"), split="validation")
    path = written.write(checkpoint)
    saved = json.loads(path.read_text(encoding="utf-8"))
    assert saved["weights"] == {"update": 7, "averaged": ["checkpoint_6.pt", "checkpoint_7.pt"], "fingerprint": "ab"}
    assert set(saved["weights"]) == set(run_record.Weights.__dataclass_fields__)
    assert GenerationSettings.read(checkpoint) == written
    saved["weights"]["step"] = saved["weights"].pop("update")
    path.write_text(json.dumps(saved), encoding="utf-8")
    assert GenerationSettings.read(checkpoint) == written


def test_an_alpha_tuned_on_other_weights_than_the_path_holds_now_is_not_used(tmp_path, caplog):
    """tune binds its choice to the weights it tuned (the update, the checkpoints averaged, a hash
    of the weights); the same path holding others later (an average rebuilt from newer
    checkpoints, a checkpoint_last.pt trained on, another run's at the same update) decodes with
    the preset's alpha and says why. A copy of the run keeps its alphas."""
    run_dir = tmp_path / "run"
    average = write_weights(run_dir / "checkpoint_average.pt", 1, 4, averaged=[str(run_dir / f"checkpoint_{s}.pt") for s in (2, 4)])
    last = write_weights(run_dir / "checkpoint_last.pt", 2, 4)
    GenerationSettings(1.2, 4, average.identity()).write(run_dir / "checkpoint_average.pt")
    GenerationSettings(2.0, 4, last.identity()).write(run_dir / "checkpoint_last.pt")

    def alpha(path):
        tuned = Checkpoint.load(path).generation()
        return None if tuned is None else tuned.length_penalty

    assert alpha(run_dir / "checkpoint_average.pt") == 1.2 and alpha(run_dir / "checkpoint_last.pt") == 2.0
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    assert alpha(copy / "checkpoint_average.pt") == 1.2 and alpha(copy / "checkpoint_last.pt") == 2.0

    write_weights(run_dir / "checkpoint_average.pt", 1, 6, averaged=[str(run_dir / f"checkpoint_{s}.pt") for s in (4, 6)])
    write_weights(run_dir / "checkpoint_last.pt", 2, 6)  # trained on
    with caplog.at_level(logging.WARNING, logger="translate"):
        assert alpha(run_dir / "checkpoint_average.pt") is None and alpha(run_dir / "checkpoint_last.pt") is None
    assert ("alpha 1.2 for checkpoint_average.pt when it held update 4, the mean of checkpoint_2.pt .. checkpoint_4.pt; "
            "it holds update 6, the mean of checkpoint_4.pt .. checkpoint_6.pt now: not used") in caplog.text
    assert "alpha 2.0 for checkpoint_last.pt when it held update 4; it holds update 6 now" in caplog.text
    write_weights(copy / "checkpoint_last.pt", 3, 4)  # another model's weights at the same update
    assert alpha(copy / "checkpoint_last.pt") is None
    # An average of the same checkpoints as the one tuned, however built, keeps its alpha.
    write_weights(run_dir / "checkpoint_average.pt", 1, 4, averaged=[str(tmp_path / "elsewhere" / f"checkpoint_{s}.pt") for s in (2, 4)])
    assert alpha(run_dir / "checkpoint_average.pt") == 1.2


def test_damaged_tuned_settings_are_one_line(tmp_path):
    write_weights(tmp_path / "checkpoint_last.pt", 1, 4)
    GenerationSettings.beside(tmp_path / "checkpoint_last.pt").write_text("{", encoding="utf-8")
    with pytest.raises(TranslateError, match=r"checkpoint_last.pt.generation.json cannot be read .*translate tune again"):
        Checkpoint.load(tmp_path / "checkpoint_last.pt").generation()


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes on an AVX2 Zen 1: the tuned alpha read with its weights: test_tune_records_the_best_alpha_and_decode_uses_it
def test_export_and_plot_use_the_alpha_tuned_for_the_checkpoint_they_read(trained_run, tmp_path):
    """Two checkpoints tuned to different alphas: exporting and plotting the one decode would not
    choose (export.checkpoint, plot.checkpoint) carries its own alpha, not that of the one decode
    reads, nor the preset's."""
    from translate.hydra_cli import load_config
    from translate.verbs import plot

    overrides, run_dir = copy_of(trained_run, tmp_path)
    other = run_dir / "checkpoint_other.pt"
    shutil.copyfile(run_dir / "checkpoint_last.pt", other)
    fast = ["tune.sentences=8", "tune.extend_to=0"]
    run_cli("tune", *overrides, *fast, "tune.alphas=[0.3]", check=True)  # decode's: checkpoint_last.pt
    run_cli("tune", *overrides, *fast, "tune.alphas=[1.7]", f"decode.checkpoint={other}", check=True)

    run_cli("export", *overrides, "export.format=transformers", f"export.checkpoint={other}",
            f"export.output={tmp_path / 'hf'}", check=True)
    assert json.loads((tmp_path / "hf" / "generation_config.json").read_text())["length_penalty"] == 1.7
    assert "length penalty 1.7 (chosen by translate tune" in (tmp_path / "hf" / "README.md").read_text()
    run_cli("export", *overrides, f"export.output={tmp_path / 'ct2'}", check=True)  # decode's checkpoint
    assert "`length_penalty=0.3` (chosen by translate tune" in (tmp_path / "ct2" / "README.md").read_text()

    searched = []
    original = Translator.search

    def spy(self, sentences, settings=None, first_line=1):
        searched.append(settings.length_penalty)
        return original(self, sentences, settings, first_line)

    output = tmp_path / "attention.png"
    cfg = load_config("plot", overrides + [f"plot.checkpoint={other}", f"plot.output={output}", "decode.max_len_b=5"])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Translator, "search", spy)
        plot.plot(cfg)
    assert searched == [1.7]
    assert json.loads(output.with_suffix(".json").read_text())["length_penalty"] == 1.7


def test_tune_records_the_best_alpha_and_decode_uses_it(trained_run, tmp_path):
    overrides, run_dir = copy_of(trained_run, tmp_path)
    result = run_cli("tune", *overrides, "tune.alphas=[0.0,2.5]", "tune.sentences=150", check=True)
    printed = {float(a): float(b) for a, b in re.findall(r"alpha ([\d.]+): sacreBLEU ([\d.]+)", result.stdout)}
    assert set(printed) == {0.0, 2.5}, result.stdout
    recorded = json.loads((run_dir / "run_record.json").read_text())["length_penalty"]  # the history
    tuned = Checkpoint.load(Path(recorded["checkpoint"]))  # decode's: the average (config=tiny)
    chosen = tuned.generation()  # beside the checkpoint, bound to the weights it tuned
    assert chosen is not None and printed[chosen.length_penalty] == max(printed.values())
    assert chosen.split == "validation" and chosen.sentences == 150 and chosen.beam_size == 4
    assert chosen.weights == tuned.identity() and chosen.weights.update > 0 and chosen.command.startswith("translate tune")
    assert recorded["alpha"] == chosen.length_penalty and recorded["weights"]["fingerprint"] == chosen.weights.fingerprint

    # Each score is the sacreBLEU of the model's own beam search at that alpha, scored apart.
    import datasets

    rows = datasets.load_dataset(str(MULTI30K), "de-en", split="validation")["translation"][:150]
    translator = Translator.from_checkpoint(run_dir / "checkpoint_last.pt")
    for alpha, score in printed.items():
        hypotheses = translator.translate([r["en"] for r in rows], DecodeConfig(length_penalty=alpha))
        assert round(sacrebleu.corpus_bleu(hypotheses, [[r["de"] for r in rows]]).score, 2) == score

    sentences = tmp_path / "in.en"
    sentences.write_text("A dog runs.\n")
    plain = run_cli("decode", *overrides, f"decode.input={sentences}", check=True)
    assert f"alpha {chosen.length_penalty})" in plain.stderr
    told = run_cli("decode", *overrides, f"decode.input={sentences}", "decode.length_penalty=0.6", check=True)
    assert "alpha 0.6)" in told.stderr


def test_alphas_beyond_the_grid_while_its_largest_is_best():
    """A best alpha at the grid's edge: steps of the last spacing beyond it, until one is worse
    or tune.extend_to is passed; none with extend_to=0."""
    from translate.verbs.tune import search_alphas

    def score(alpha):  # sacreBLEU rising to alpha 2.1, falling after
        return {"alpha": alpha, "sacrebleu": 30.0 - abs(alpha - 2.1)}

    grid = [0.0, 0.6, 1.2, 1.5]
    assert [s["alpha"] for s in search_alphas(grid, 3.0, score)] == grid + [1.8, 2.1, 2.4]
    assert [s["alpha"] for s in search_alphas(grid, 2.0, score)] == grid + [1.8]
    assert [s["alpha"] for s in search_alphas(grid, 0.0, score)] == grid
    assert [s["alpha"] for s in search_alphas([1.5, 2.1, 2.7], 3.0, score)] == [1.5, 2.1, 2.7]  # the best is inside


def test_a_choice_at_the_cap_is_named_as_one_a_larger_alpha_may_beat(caplog):
    """The best alpha the largest tried, because tune.extend_to stopped the search: a warning
    says so; none where a larger alpha was tried and scored lower."""
    from translate.verbs.tune import search_alphas

    def score(alpha):  # sacreBLEU rising to alpha 2.1, falling after
        return {"alpha": alpha, "sacrebleu": 30.0 - abs(alpha - 2.1)}

    with caplog.at_level("WARNING", logger="translate.verbs.tune"):
        search_alphas([0.0, 0.6, 1.2, 1.5], 2.0, score)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "the chosen alpha, 1.8, is the largest tried (tune.extend_to is 2.0): "
        "a larger one may score higher; raise tune.extend_to to try it"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="translate.verbs.tune"):
        search_alphas([0.0, 0.6, 1.2, 1.5], 3.0, score)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_an_alpha_tuned_before_it_was_kept_beside_the_weights_is_named_not_used(tmp_path, caplog):
    """A run tuned by an older translate holds its alpha in the run record alone: decode no
    longer reads it there, and says so rather than drop it silently; a choice kept beside the
    weights (its record entry names their fingerprint) draws no such line."""
    write_weights(tmp_path / "checkpoint_last.pt", 1, 4)
    run_record.record_length_penalty(tmp_path, tmp_path / "checkpoint_last.pt", {"alpha": 1.4, "weights": {"step": 4}})
    with caplog.at_level(logging.WARNING, logger="translate"):
        assert Checkpoint.load(tmp_path / "checkpoint_last.pt").generation() is None
    assert "chose alpha 1.4 for it before its choice was kept beside the weights; it is not used" in caplog.text
    caplog.clear()
    run_record.record_length_penalty(tmp_path, tmp_path / "checkpoint_last.pt",
                                     {"alpha": 1.4, "weights": {"step": 4, "fingerprint": "0"}})
    with caplog.at_level(logging.WARNING, logger="translate"):
        Checkpoint.load(tmp_path / "checkpoint_last.pt").generation()
    assert "before its choice was kept" not in caplog.text
