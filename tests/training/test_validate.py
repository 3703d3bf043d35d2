"""Validation during training (translate.training.validate): dev loss and BLEU, the best
checkpoint kept, and early stopping."""

import json

import pytest
import torch

from tests.conftest import MULTI30K, need, one_line_error, run_cli, train_resumable
from translate import checkpoint


def test_validation_keeps_the_best_and_stops_early(tmp_path):
    need(MULTI30K)
    result = train_resumable(tmp_path, "run", "train.max_steps=6", "valid.every_steps=2", "valid.bleu_sentences=20", "valid.metric=bleu")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("dev loss") == 3 and "bleu" in result.stderr
    best = checkpoint.load(tmp_path / "run" / "checkpoint_best.pt")
    assert best["step"] in (2, 4, 6) and "bleu" in best["dev"]
    # With (almost) no learning the dev loss never improves after the first validation.
    frozen = train_resumable(tmp_path, "frozen", "train.max_steps=20", "valid.every_steps=2", "valid.patience=2", "optim.lr_scale=1e-12")
    assert frozen.returncode == 0, frozen.stderr
    assert "early stopping at update 6" in frozen.stderr
    assert checkpoint.load(tmp_path / "frozen" / "checkpoint_last.pt")["valid"]["since_best"] == 2


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes: validation's BLEU and stopping: the test above
def test_a_target_bleu_stops_training_and_the_record_keeps_the_time_to_it(tmp_path):
    """A target no validation reaches (100) never stops the run, nor enters its record; one the
    first validation reaches (0.0: any BLEU) stops it there. Together they fail where the run
    stops at the first validation whatever its BLEU, never stops, or compares the wrong way."""
    need(MULTI30K)
    validating = ["valid.every_steps=4", "valid.bleu_sentences=20"]
    unreached = train_resumable(tmp_path, "unreached", "train.max_steps=12", *validating, "train.target_bleu=100")
    assert unreached.returncode == 0, unreached.stderr
    assert "target_bleu reached" not in unreached.stderr and unreached.stderr.count("dev loss") == 3
    assert checkpoint.load(tmp_path / "unreached" / "checkpoint_last.pt")["step"] == 12
    assert "target" not in json.loads((tmp_path / "unreached" / "run_record.json").read_text())
    result = train_resumable(tmp_path, "run", "train.max_steps=20", *validating,
                             "train.target_bleu=0.0")  # any BLEU reaches it: the first validation
    assert result.returncode == 0, result.stderr
    assert "stopping at update 4: train.target_bleu reached" in result.stderr
    assert checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")["step"] == 4
    record = json.loads((tmp_path / "run" / "run_record.json").read_text())
    target = record["target"]
    assert target["update"] == 4 and target["target_bleu"] == 0.0 and target["bleu"] >= 0.0
    assert 0 < target["training_seconds"] < target["process_seconds"]  # start-up counts from the process start
    assert target["target_tokens"] == record["training"]["target_tokens"] > 0
    table = run_cli("table", f"table.runs=[{tmp_path / 'run'}]", "table.format=json")
    row = json.loads(table.stdout)[0]
    assert row["target_updates"] == 4 and row["target_minutes"] == target["process_seconds"] / 60


def test_a_target_bleu_needs_validations_with_bleu(tmp_path):
    one_line_error(run_cli("train", "config=tiny", f"run_dir={tmp_path}/run", "train.target_bleu=25"),
                   "train.target_bleu needs validations with BLEU")


@pytest.mark.slow  # make test-slow: it keeps the default suite under 10 minutes
def test_a_resumed_run_keeps_the_validation_of_its_last_checkpoint(tmp_path):
    """The checkpoint written at a validation's update holds that validation: resumed there, a
    run's tracker is the uninterrupted run's (and checkpoint_best.pt is not overwritten by a
    worse model for want of it)."""
    need(MULTI30K)
    every = ["valid.every_steps=5", "checkpoint.every_steps=5"]
    assert train_resumable(tmp_path, "whole", "train.max_steps=10", *every).returncode == 0
    assert train_resumable(tmp_path, "split", "train.max_steps=5", *every).returncode == 0
    assert checkpoint.load(tmp_path / "split" / "checkpoint_last.pt")["valid"]["best"] is not None
    assert train_resumable(tmp_path, "split", "train.max_steps=10", *every).returncode == 0
    whole, split = (checkpoint.load(tmp_path / run / "checkpoint_last.pt") for run in ("whole", "split"))
    assert split["valid"] == whole["valid"]
    assert all(torch.equal(split["model"][name], whole["model"][name]) for name in whole["model"])
