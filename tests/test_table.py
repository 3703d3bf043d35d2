"""`translate table` (translate.verbs.table): runs side by side from their run records, as the
paper's Table 3."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from tests.conftest import MULTI30K, SMALL, need, one_line_error, run_cli
from translate.core.run_record import ModelFacts, RunRecord, Score, TrainingTotals, Validation
from translate.core.choices import TableFormat
from translate.core.config import TranslateConfig
from translate.verbs import table


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes: the table's rules: the tests below, on made records
def test_a_sweeps_runs_side_by_side(tmp_path):
    """Two real tiny runs (a multirun's folder stands for its jobs): the setting that differs,
    parameters, updates, compute, dev metrics, and test BLEU for the one whose decode was scored."""
    need(MULTI30K)
    run_dir = tmp_path / "sweep"
    common = SMALL[:-2] + ["train.max_steps=4", "valid.every_steps=2", "valid.bleu_sentences=10",
                           f"data.cache_dir={tmp_path}/cache"]
    run_cli("train", "-m", *common, f"run_dir={run_dir}", "model.dropout=0.0,0.2", check=True)
    scored = run_dir / "model.dropout:0.2"
    run_cli("decode", *common, f"run_dir={scored}", "checkpoint.average_last=0", "decode.max_len_b=3", check=True)
    run_cli("bleu", *common, f"run_dir={scored}", check=True)
    result = run_cli("table", f"table.runs=[{run_dir}]", "table.format=json", check=True)
    rows = json.loads(result.stdout)
    assert [row["model.dropout"] for row in rows] == [0.0, 0.2]
    assert set(rows[0]) == {"run", "model.dropout", "params", "updates", "train_flops", "dev_loss", "dev_ppl",
                            "dev_bleu", "test_bleu", "test_scorings"}
    assert [row["test_scorings"] for row in rows] == [0, 1]
    for row in rows:
        assert row["updates"] == 4 and row["params"] > 0 and row["train_flops"] > 0
        assert row["dev_loss"] > 0 and row["dev_ppl"] > 1 and row["dev_bleu"] is not None
    assert rows[0]["test_bleu"] is None and rows[1]["test_bleu"] is not None
    markdown = run_cli("table", f"table.runs=[{run_dir}/model.dropout:0.0,{scored}]", check=True).stdout.splitlines()
    assert markdown[0].startswith("| run | model.dropout | params |") and len(markdown) == 4


def test_a_folder_that_is_not_a_run_is_one_line(tmp_path):
    one_line_error(run_cli("table", f"table.runs=[{tmp_path}]"), f"{tmp_path} is not a run")


def recorded_run(folder: Path, dropout: float, seed: int, loss: float, nll: float, bleu: float) -> Path:
    """A run record as train writes one, with these settings and dev metrics."""
    training = TrainingTotals(updates=100, seconds=60.0, model_flops=1e12, target_tokens=10**6, skipped_updates=0,
                              device="cpu", processes=1, precision="fp32")
    RunRecord(settings={"run_dir": str(folder), "model": {"dropout": dropout}, "train": {"seed": seed}},
              model=ModelFacts(parameters=1000), training=training,
              valid=Validation(update=100, metrics={"loss": loss, "nll": nll, "bleu": bleu})).save(folder)
    return folder


def test_runs_that_differ_only_in_their_seed_are_one_row(tmp_path):
    """Three seeds of two dropouts: two rows, each with the seeds, n, and every measure's mean
    and standard deviation as Python's statistics computes them from the records."""
    measured = {(0.1, 1): (4.1, 3.9, 20.5), (0.1, 2): (4.3, 4.0, 21.0), (0.1, 3): (4.0, 3.8, 19.0),
                (0.3, 1): (4.6, 4.4, 17.0), (0.3, 2): (4.5, 4.3, 18.5), (0.3, 3): (4.9, 4.6, 16.0)}
    runs = [recorded_run(tmp_path / f"d{dropout}-s{seed}", dropout, seed, *values) for (dropout, seed), values in measured.items()]
    cfg = TranslateConfig()
    cfg.table.runs, cfg.table.format = [str(run) for run in runs], TableFormat.json
    rows = table.table(cfg)
    assert [(row["model.dropout"], row["train.seed"], row["n"]) for row in rows] == [(0.1, [1, 2, 3], 3), (0.3, [1, 2, 3], 3)]
    for row in rows:
        losses, nlls, bleus = zip(*(values for (dropout, _), values in measured.items() if dropout == row["model.dropout"]))
        perplexities = [math.exp(nll) for nll in nlls]
        for name, values in (("dev_loss", losses), ("dev_ppl", perplexities), ("dev_bleu", bleus)):
            assert row[name] == statistics.mean(values) and row[f"{name}_std"] == statistics.stdev(values)
        assert row["updates"] == 100 and row["updates_std"] == 0 and row["test_bleu"] is None and row["test_bleu_std"] is None
        assert row["run"] == ", ".join(str(tmp_path / f"d{row['model.dropout']}-s{seed}") for seed in (1, 2, 3))
    lines = table.markdown(rows).splitlines()
    assert lines[0] == ("| run | model.dropout | train.seed | n | params | updates | train_flops | dev_loss | dev_ppl | dev_bleu "
                        "| test_bleu |")
    assert f"| {rows[0]['dev_bleu']:.2f} ± {rows[0]['dev_bleu_std']:.2f} |" in lines[2]


def test_seeds_without_a_twin_stay_rows_of_their_own(tmp_path):
    """Seeds that differ along with another setting group nothing: one row per run, as before."""
    runs = [recorded_run(tmp_path / "a", 0.1, 1, 4.0, 3.9, 20.0), recorded_run(tmp_path / "b", 0.3, 2, 4.5, 4.4, 18.0)]
    rows = table.rows(runs)
    assert [(row["model.dropout"], row["train.seed"]) for row in rows] == [(0.1, 1), (0.3, 2)]
    assert "n" not in rows[0] and "dev_loss_std" not in rows[0]


def test_a_setting_added_after_a_run_was_recorded_reads_as_the_value_it_trained_at(tmp_path):
    """A record that predates optim.cut_peak_power trained at 1.0 (ADDED_LATER): beside a run at
    0.5 its row says 1.0, not None; beside a run at 1.0 the setting does not differ at all."""
    old, cut = recorded_run(tmp_path / "old", 0.1, 1, 4.0, 3.9, 20.0), recorded_run(tmp_path / "cut", 0.1, 1, 3.9, 3.8, 21.0)
    record = RunRecord.load(cut)
    record.settings["optim"] = {"cut_peak_power": 0.5}
    record.save(cut)
    assert [row["optim.cut_peak_power"] for row in table.run_rows([old, cut])] == [1.0, 0.5]
    record.settings["optim"] = {"cut_peak_power": 1.0}
    record.save(cut)
    assert "optim.cut_peak_power" not in table.run_rows([old, cut])[0]


def test_test_bleu_is_the_score_of_the_test_splits_decode(tmp_path):
    """A run's record may hold scores of other files decoded in its run_dir (a sweep scores its
    dev decodes there): test_bleu is the last score of decode's test output alone, else none."""
    def score(hyp, value):
        return Score(hyp=hyp, lines=10, variant="newstest2014", scores={"sacrebleu": {"value": value}}, text="")

    settings = {"data": {"tgt_lang": "de"}, "decode": {"split": "test"}}
    RunRecord(settings=settings, scores=[score("decode/test.de", 20.0), score("sweep/dev.de", 30.0)]).save(tmp_path)
    assert table.run_rows([tmp_path])[0]["test_bleu"] == 20.0
    RunRecord(settings=settings, scores=[score("sweep/dev.de", 30.0)]).save(tmp_path)
    assert table.run_rows([tmp_path])[0]["test_bleu"] is None


def test_the_table_counts_each_runs_test_scorings(tmp_path):
    """A run whose test split was scored twice says 2; over seeds, each seed's count beside its seed."""
    def score(value):
        return Score(hyp="decode/test.de", lines=10, variant="newstest2014", scores={"sacrebleu": {"value": value}},
                     text="", split="test", held_out=True)

    runs = [recorded_run(tmp_path / f"s{seed}", 0.1, seed, 4.0, 3.9, 20.0) for seed in (1, 2)]
    for run, scores in zip(runs, ([score(20.0), score(21.0)], [score(22.0)])):
        record = RunRecord.load(run)
        record.settings["decode"] = {"split": "test"}
        record.scores = scores
        record.save(run)
    assert [(row["test_bleu"], row["test_scorings"]) for row in table.run_rows(runs)] == [(21.0, 2), (22.0, 1)]
    row, = table.rows(runs)
    assert row["test_scorings"] == [2, 1] and row["test_bleu"] == 21.5
    assert "test_scorings" not in table.run_rows([recorded_run(tmp_path / "none", 0.1, 1, 4.0, 3.9, 20.0)])[0]


def test_the_table_shows_the_dev_bleu_tune_chose(tmp_path):
    """Candidates are compared on the dev split as the chain decodes it: the dev BLEU at the alpha
    `translate tune` chose (its last choice), and that alpha; none for a run not tuned; a mean over seeds."""
    def tuned(folder, seed, alpha, scores):
        run = recorded_run(folder, 0.3, seed, 4.0, 3.9, 20.0)
        record = RunRecord.load(run)
        record.others["length_penalty"] = {"alpha": alpha, "split": "validation",
                                           "scores": [{"alpha": a, "sacrebleu": b} for a, b in scores]}
        record.save(run)
        return run

    runs = [tuned(tmp_path / "s1", 1, 1.0, [(0.6, 41.5), (1.0, 41.9), (1.2, 41.7)]),
            tuned(tmp_path / "s2", 2, 0.6, [(0.6, 42.3), (1.0, 42.1)])]
    rows = table.rows(runs)
    assert len(rows) == 1 and rows[0]["tuned_dev_bleu"] == statistics.mean([41.9, 42.3])
    assert rows[0]["tuned_alpha"] == statistics.mean([1.0, 0.6])
    untuned = recorded_run(tmp_path / "s3", 0.1, 3, 4.0, 3.9, 20.0)
    by_run = {row["run"]: row for row in table.run_rows([runs[0], untuned])}
    assert (by_run[str(runs[0])]["tuned_dev_bleu"], by_run[str(untuned)]["tuned_dev_bleu"]) == (41.9, None)
    assert "tuned_dev_bleu" not in table.run_rows([untuned])[0]
