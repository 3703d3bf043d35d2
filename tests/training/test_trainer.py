"""The training run (translate.verbs.train, translate.training.trainer) end to end: a self-describing checkpoint,
periods of zero, non-finite updates skipped, counted and stopped, and train.compile."""

from dataclasses import replace

import pytest
import torch

from tests.conftest import MULTI30K, SMALL, hook_env, need, run_cli, small_run, train_resumable
from translate import checkpoint
from translate.model import Transformer
from translate.verbs.train import train


def test_max_steps_writes_a_self_describing_checkpoint(compose):
    need(MULTI30K)
    cfg = compose("train", *SMALL[:-2], "train.max_steps=3")
    path = train(cfg)
    payload = torch.load(path, map_location="cpu", weights_only=False)
    assert payload["step"] == 3
    assert payload["model_config"]["d_model"] == 32 and payload["model_config"]["vocab_size"] > 0
    from translate.data.vocabulary import Vocabulary

    assert len(Vocabulary(payload["vocabulary"])) == payload["model_config"]["vocab_size"]
    model = Transformer(replace(cfg.model, vocab_size=payload["model_config"]["vocab_size"]))
    model.load_state_dict(payload["model"])  # plain keys, loads as is


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes: each period's own tests
def test_zero_periods_mean_never(tmp_path):
    """train.log_every=0, checkpoint.every_steps=0 and valid.every_steps=0: no logging, periodic
    checkpoint or validation (they divided by zero), and one checkpoint at the end."""
    need(MULTI30K)
    result = run_cli("train", *small_run(tmp_path, "train.max_steps=3", "train.log_every=0", "checkpoint.every_steps=0",
                                         "valid.every_steps=0"))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint_*.pt")) == ["checkpoint_3.pt", "checkpoint_last.pt"]


NAN_LOSS = """
import translate.training.loss as t
original, calls = t.label_smoothed_nll, []
def poisoned(*args, **kwargs):
    calls.append(1)
    loss, nll = original(*args, **kwargs)
    if {condition}:
        loss = loss * float("nan")
    return loss, nll
t.label_smoothed_nll = poisoned
"""


def test_non_finite_updates_are_skipped_and_counted(tmp_path):
    need(MULTI30K)
    env = hook_env(tmp_path, NAN_LOSS.format(condition="len(calls) in (3, 4)"))
    result = train_resumable(tmp_path, "run", "train.max_steps=6", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("non-finite loss or gradient, skipped") == 2
    payload = checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")
    assert payload["step"] == 6 and payload["skipped_updates"] == 2
    assert all(torch.isfinite(t).all() for t in payload["model"].values())


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes: skipping: the tests above
def test_the_skipped_update_count_carries_over_a_resume(tmp_path):
    need(MULTI30K)
    first = train_resumable(tmp_path, "run", "train.max_steps=6", env=hook_env(tmp_path, NAN_LOSS.format(condition="len(calls) in (3, 4)")))
    assert first.returncode == 0, first.stderr
    resumed = train_resumable(tmp_path, "run", "train.max_steps=8")
    assert resumed.returncode == 0, resumed.stderr
    payload = checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")
    assert payload["step"] == 8 and payload["skipped_updates"] == 2


def test_repeated_non_finite_updates_stop_the_run_clearly(tmp_path):
    need(MULTI30K)
    env = hook_env(tmp_path, NAN_LOSS.format(condition="len(calls) > 6"))
    result = train_resumable(tmp_path, "run", "train.max_steps=50", "train.max_nonfinite=4", env=env)
    assert result.returncode == 1
    line = next(l for l in result.stderr.splitlines() if "error:" in l)
    assert "4 non-finite updates in a row at update 7" in line and "checkpoint_last.pt" in line


@pytest.mark.slow
def test_compiled_model_trains(tmp_path):
    need(MULTI30K)
    result = run_cli("train", *small_run(tmp_path, "train.max_steps=2", "train.log_every=1", "train.compile=true"))
    assert result.returncode == 0, result.stderr
    payload = torch.load(tmp_path / "run" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert not any(k.startswith("_orig_mod.") for k in payload["model"])


def test_epoch_checkpoints_are_written_at_the_ends_of_epochs(tmp_path, compose):
    """checkpoint.every_epochs=1 with no other period: a numbered checkpoint after the last
    update of each epoch (a pass over every training pair), and none at the run's end, so that
    averaging takes the last epochs (as fairseq's --num-epoch-checkpoints)."""
    import itertools

    import numpy as np

    from translate.data.batching import token_batches
    from translate.data.preparation import prepare

    need(MULTI30K)
    overrides = small_run(tmp_path, "train.max_steps=50", "train.log_every=10", "checkpoint.every_steps=0",
                          "checkpoint.every_minutes=null", "checkpoint.every_epochs=1", "checkpoint.keep_last=10",
                          "valid.every_steps=0")
    result = run_cli("train", *overrides, check=True)
    split = prepare(compose("train", *overrides).data).train
    sizes = [len(token_batches(split.src_lengths, split.tgt_lengths, 1500, seed=1, epoch=k)) for k in range(10)]
    ends = [int(n) for n in np.cumsum(sizes) if n <= 50]  # one batch an update: 21 and 42
    assert len(ends) >= 2 and 50 not in ends
    run_dir = tmp_path / "run"
    assert sorted(p.name for p in run_dir.glob("checkpoint_*.pt")) == sorted(
        itertools.chain([f"checkpoint_{n}.pt" for n in ends], ["checkpoint_last.pt"]))
    for epoch, update in enumerate(ends, 1):
        assert f"epoch {epoch} ended at update {update}: checkpoint saved" in result.stderr
    assert checkpoint.load(run_dir / "checkpoint_last.pt")["step"] == 50
