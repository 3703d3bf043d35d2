"""The length penalty chosen on the dev split (translate.verbs.tune): what it records, and that decode
then uses it unless told otherwise."""

import json
import logging
import re
import shutil
from pathlib import Path

import sacrebleu

from tests.conftest import MULTI30K, run_cli, run_dir_of
from translate import checkpoint
from translate.core import run_record
from translate.core.config import DecodeConfig
from translate.hydra_cli import load_config
from translate.translator import Translator


def copy_of(trained_run, tmp_path):
    """The shared trained run's overrides, pointed at a copy of it (tune writes its record)."""
    run_dir = tmp_path / "run"
    shutil.copytree(run_dir_of(trained_run), run_dir)
    return [o for o in trained_run if not o.startswith("run_dir=")] + [f"run_dir={run_dir}"], run_dir


def test_the_paper_alpha_without_a_choice_and_the_recorded_one_with_it(tmp_path):
    assert run_record.chosen_length_penalty(tmp_path, tmp_path / "checkpoint_last.pt") is None
    assert load_config("decode", [f"run_dir={tmp_path}"]).decode.length_penalty == 0.6
    run_record.save(tmp_path, {run_record.LENGTH_PENALTY: {"alpha": 1.2}})
    assert load_config("decode", [f"run_dir={tmp_path}"]).decode.length_penalty == 1.2
    assert load_config("export", [f"run_dir={tmp_path}"]).decode.length_penalty == 1.2
    # Told otherwise on the command line, even to the paper's value:
    assert load_config("decode", [f"run_dir={tmp_path}", "decode.length_penalty=0.6"]).decode.length_penalty == 0.6


def test_each_checkpoint_decodes_with_the_alpha_tuned_for_it(tmp_path, caplog):
    """A tune of one checkpoint leaves another's alpha alone; a checkpoint never tuned decodes
    with the preset's (the paper's 0.6 here), and the record's last entry is the last tune."""
    for step in (2, 4):
        (tmp_path / f"checkpoint_{step}.pt").write_bytes(b"")
    run_record.record_length_penalty(tmp_path, tmp_path / "checkpoint_average.pt", {"alpha": 1.2})
    run_record.record_length_penalty(tmp_path, tmp_path / "checkpoint_4.pt", {"alpha": 2.0})

    def alpha(*overrides):
        return load_config("decode", [f"run_dir={tmp_path}", *overrides]).decode.length_penalty

    assert alpha("checkpoint.average_last=2") == 1.2  # decode reads the average by default
    assert alpha(f"decode.checkpoint={tmp_path / 'checkpoint_4.pt'}") == 2.0
    with caplog.at_level(logging.WARNING, logger="translate"):
        assert alpha(f"decode.checkpoint={tmp_path / 'checkpoint_2.pt'}") == 0.6
    assert "for checkpoint_4.pt, checkpoint_average.pt" in caplog.text and "not for checkpoint_2.pt" in caplog.text
    assert alpha("checkpoint.average_last=0") == 0.6  # checkpoint_last.pt: never tuned
    assert run_record.load(tmp_path)["length_penalty"]["alpha"] == 2.0
    assert run_record.tuned_checkpoints(tmp_path) == ["checkpoint_4.pt", "checkpoint_average.pt"]


def test_an_alpha_tuned_on_other_weights_than_the_path_holds_now_is_not_used(tmp_path, caplog):
    """tune records which weights it tuned (the update, the checkpoints averaged); the same path
    holding others later (an average rebuilt from newer checkpoints, a checkpoint_last.pt trained
    on) decodes with the preset's alpha and says why. A copy of the run keeps its alphas."""
    import os

    import torch

    run_dir = tmp_path / "run"
    run_dir.mkdir()

    def write(name, step, when, **extra):
        torch.save({"step": step, **extra}, run_dir / name)
        os.utime(run_dir / name, (when, when))

    write("checkpoint_2.pt", 2, 1000)
    write("checkpoint_4.pt", 4, 1001)
    write("checkpoint_average.pt", 4, 1002, averaged=[str(run_dir / "checkpoint_2.pt"), str(run_dir / "checkpoint_4.pt")])
    write("checkpoint_last.pt", 4, 1001)
    for name, alpha in (("checkpoint_average.pt", 1.2), ("checkpoint_last.pt", 2.0)):
        run_record.record_length_penalty(run_dir, run_dir / name, {"alpha": alpha, "weights": checkpoint.identity(run_dir / name)})

    def alpha(folder, *overrides):
        return load_config("decode", [f"run_dir={folder}", *overrides]).decode.length_penalty

    assert alpha(run_dir, "checkpoint.average_last=2") == 1.2
    assert alpha(run_dir, "checkpoint.average_last=0") == 2.0
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy, copy_function=shutil.copyfile)  # new modification times, same weights
    assert alpha(copy, "checkpoint.average_last=2") == 1.2 and alpha(copy, "checkpoint.average_last=0") == 2.0

    write("checkpoint_6.pt", 6, 1003)  # trained on: decode rebuilds the average from 4 and 6
    write("checkpoint_last.pt", 6, 1003)
    with caplog.at_level(logging.WARNING, logger="translate"):
        assert alpha(run_dir, "checkpoint.average_last=2") == 0.6
        assert alpha(run_dir, "checkpoint.average_last=0") == 0.6
    assert ("alpha 1.2 for checkpoint_average.pt when it held update 4, the mean of checkpoint_2.pt .. checkpoint_4.pt; "
            "it holds update 6, the mean of checkpoint_4.pt .. checkpoint_6.pt now") in caplog.text
    assert "alpha 2.0 for checkpoint_last.pt when it held update 4; it holds update 6 now" in caplog.text
    # An average of the same checkpoints as the one tuned, however built, keeps its alpha.
    write("checkpoint_average.pt", 4, 1004, averaged=[str(tmp_path / "elsewhere" / n) for n in ("checkpoint_2.pt", "checkpoint_4.pt")])
    os.remove(run_dir / "checkpoint_6.pt")
    assert alpha(run_dir, "checkpoint.average_last=2") == 1.2


def test_tune_records_the_best_alpha_and_decode_uses_it(trained_run, tmp_path):
    overrides, run_dir = copy_of(trained_run, tmp_path)
    result = run_cli("tune", *overrides, "tune.alphas=[0.0,2.5]", "tune.sentences=150", check=True)
    printed = {float(a): float(b) for a, b in re.findall(r"alpha ([\d.]+): sacreBLEU ([\d.]+)", result.stdout)}
    assert set(printed) == {0.0, 2.5}, result.stdout
    chosen = json.loads((run_dir / "run_record.json").read_text())["length_penalty"]
    assert printed[chosen["alpha"]] == max(printed.values())
    assert chosen["split"] == "validation" and chosen["sentences"] == 150
    assert chosen["weights"]["step"] == checkpoint.load(Path(chosen["checkpoint"]))["step"] > 0  # what it tuned

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
    assert f"alpha {chosen['alpha']})" in plain.stderr
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
