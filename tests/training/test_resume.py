"""Training that survives (translate.training.resume): exact resume after SIGKILL, interrupted
writes, SIGTERM and Ctrl-C, under torchrun too; fine-tuning from another run's weights."""

import os
import signal
import subprocess
import time

import pytest
import torch

from tests.conftest import MULTI30K, RESUMABLE, cli, hook_env, in_update, need, one_line_error, run, small_run, start, torchrun, \
    train_resumable, wait_for
from translate import checkpoint


KILL_IN_UPDATE_8 = in_update(8, "os.kill(os.getpid(), signal.SIGKILL)")


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_one(tmp_path):
    need(MULTI30K)
    hook = """
import os, signal
import translate.core.paths as c
original, calls = os.replace, []
def dying_replace(source, target):
    if str(target).endswith("checkpoint_last.pt"):
        calls.append(target)
    if len(calls) == 2:  # the second checkpoint_last.pt: killed after writing, before the rename
        os.kill(os.getpid(), signal.SIGKILL)
    return original(source, target)
c.os.replace = dying_replace
"""
    result = train_resumable(tmp_path, "run", "train.max_steps=12", env=hook_env(tmp_path, hook))
    assert result.returncode == -signal.SIGKILL
    assert checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")["step"] == 5  # the previous one, whole
    resumed = train_resumable(tmp_path, "run", "train.max_steps=12")
    assert resumed.returncode == 0, resumed.stderr
    assert checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")["step"] == 12


def test_sigterm_saves_and_exits_cleanly(tmp_path):
    need(MULTI30K)
    process = start(cli("train", *small_run(tmp_path, *RESUMABLE, "train.max_steps=100000")))
    wait_for(tmp_path / "run" / "checkpoint_5.pt")
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert time.monotonic() - sent < 30
    assert process.returncode == 1
    line = next(l for l in stderr.splitlines() if "error:" in l)
    assert "stopped by SIGTERM at update" in line and "run the same command to resume" in line
    step = int(line.split("at update ")[1].split(":")[0])
    assert checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")["step"] == step >= 5


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes: a start from other weights
def test_init_from_another_runs_weights(tmp_path):
    need(MULTI30K)
    assert train_resumable(tmp_path, "first", "train.max_steps=3").returncode == 0
    source = tmp_path / "first" / "checkpoint_last.pt"
    second = train_resumable(tmp_path, "second", "train.max_steps=1", f"train.init_from={source}", "optim.lr_scale=1e-12")
    assert second.returncode == 0, second.stderr
    assert "starting from the weights of" in second.stderr
    a, b = checkpoint.load(source), checkpoint.load(tmp_path / "second" / "checkpoint_last.pt")
    assert b["step"] == 1  # a fresh schedule
    assert all(torch.allclose(a["model"][n], b["model"][n], atol=1e-6) for n in a["model"])
    other = train_resumable(tmp_path, "third", "train.max_steps=1", f"train.init_from={source}", "model.d_ff=128")
    one_line_error(other, "different model (d_ff 64 != 128)", logs=True)


def torchrun_training(tmp_path) -> subprocess.Popen:
    """Two processes under torchrun training in tmp_path/run, once checkpoint_5.pt is written."""
    need(MULTI30K)
    agent = start(torchrun("train", *small_run(tmp_path, *RESUMABLE, "train.max_steps=100000")))
    wait_for(tmp_path / "run" / "checkpoint_5.pt")
    return agent


def test_a_stop_signal_to_one_rank_is_agreed_by_all(tmp_path):
    """Under torchrun, SIGTERM to one worker: both stop at the same update, rank 0 saves the
    random state and data position of both, and a rerun resumes."""
    agent = torchrun_training(tmp_path)
    workers = run(["pgrep", "-P", str(agent.pid)]).stdout.split()
    assert len(workers) == 2
    os.kill(int(sorted(workers, key=int)[-1]), signal.SIGTERM)  # one worker only
    _, stderr = agent.communicate(timeout=120)
    assert agent.returncode != 0
    assert "stopped by SIGTERM at update" in stderr and "stopped by a stop signal on another process" in stderr
    payload = checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")
    assert payload["step"] >= 5 and len(payload["processes"]) == 2
    assert all(p["batches"]["position"] > 0 for p in payload["processes"])
    assert not torch.equal(payload["processes"][0]["torch"], payload["processes"][1]["torch"])  # each rank its own


def ctrl_c_in_update_8(times: int) -> str:
    """Ctrl-C `times` times in the middle of update 8."""
    return in_update(8, f"for _ in range({times}):\n    os.kill(os.getpid(), signal.SIGINT)")


def as_written_before_the_schedule_class(path) -> None:
    """Rewrite a checkpoint's schedule state as the LambdaLR that older checkpoints hold (its
    last_epoch counted the applied updates)."""
    from translate.training.schedule import LearningRateSchedule

    payload = torch.load(path, map_location="cpu", weights_only=False)
    schedule = LearningRateSchedule(32, 20)
    optimizer = torch.optim.Adam(torch.nn.Linear(2, 2).parameters(), lr=1.0)
    lambda_lr = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: schedule.rate_at(done + 1))
    for _ in range(payload["step"]):
        optimizer.step()
        lambda_lr.step()
    payload["scheduler"] = lambda_lr.state_dict()
    torch.save(payload, path)


def test_killed_and_interrupted_runs_resume_bit_for_bit(tmp_path):
    """SIGKILL in update 8 (the checkpoint of update 5 rewritten as checkpoints written before
    the schedule class were) and Ctrl-C in update 8 (which finishes the update, saves and exits
    130): each resumed run ends bit for bit where an uninterrupted one does, dropout and data
    order included."""
    need(MULTI30K)
    straight = train_resumable(tmp_path, "straight", "train.max_steps=12")
    assert straight.returncode == 0, straight.stderr
    killed = train_resumable(tmp_path, "killed", "train.max_steps=12", env=hook_env(tmp_path, KILL_IN_UPDATE_8))
    assert killed.returncode == -signal.SIGKILL
    assert checkpoint.load(tmp_path / "killed" / "checkpoint_last.pt")["step"] == 5
    as_written_before_the_schedule_class(tmp_path / "killed" / "checkpoint_last.pt")
    stopped = train_resumable(tmp_path, "stopped", "train.max_steps=12", env=hook_env(tmp_path, ctrl_c_in_update_8(1)))
    assert stopped.returncode == 130, stopped.stderr
    assert "stopped by SIGINT at update 8: saved" in stopped.stderr
    assert checkpoint.load(tmp_path / "stopped" / "checkpoint_last.pt")["step"] == 8
    a = checkpoint.load(tmp_path / "straight" / "checkpoint_last.pt")
    for folder in ("killed", "stopped"):
        resumed = train_resumable(tmp_path, folder, "train.max_steps=12")
        assert resumed.returncode == 0 and "resuming from" in resumed.stderr, resumed.stderr
        b = checkpoint.load(tmp_path / folder / "checkpoint_last.pt")
        assert a["step"] == b["step"] == 12
        for name in a["model"]:
            assert torch.equal(a["model"][name], b["model"][name]), (folder, name)
        assert a["optimizer"]["state"][0]["exp_avg"].equal(b["optimizer"]["state"][0]["exp_avg"]), folder


def test_a_second_ctrl_c_exits_at_once_without_saving(tmp_path):
    need(MULTI30K)
    twice = train_resumable(tmp_path, "twice", "train.max_steps=11", env=hook_env(tmp_path, ctrl_c_in_update_8(2)))
    assert twice.returncode == 130 and "translate train: interrupted" in twice.stderr
    assert checkpoint.load(tmp_path / "twice" / "checkpoint_last.pt")["step"] == 5  # the last periodic save


@pytest.mark.slow
def test_ctrl_c_under_torchrun_saves_once_for_all_ranks(tmp_path):
    """torchrun passes Ctrl-C on to each worker: they stop at the same update, rank 0 saves both
    processes' states, nothing hangs."""
    agent = torchrun_training(tmp_path)
    agent.send_signal(signal.SIGINT)
    _, stderr = agent.communicate(timeout=120)
    assert agent.returncode != 0
    assert stderr.count("stopped by SIGINT at update") == 2, stderr
    payload = checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")
    assert payload["step"] >= 5 and len(payload["processes"]) == 2


def test_a_linear_decay_resumed_with_another_max_steps_is_refused(tmp_path):
    """A linear decay ends at train.max_steps: resuming with another would bend the line. The
    paper's decay has no end, so there a longer run may resume."""
    from translate.core.choices import Decay
    from translate.core.config import OptimConfig, to_plain
    from translate.core.errors import TranslateError
    from translate.checkpoint import Checkpoint
    from translate.training.resume import check_same_settings

    def trained(optim):
        return Checkpoint({}, {}, b"", 5, config={"optim": to_plain(optim), "train": {"max_steps": 100}}, path=tmp_path)

    linear = OptimConfig(decay=Decay.linear)
    check_same_settings(trained(linear), linear, 100)
    with pytest.raises(TranslateError, match=r"train.max_steps=200 \(saved: 100, where optim.decay=linear ends\)"):
        check_same_settings(trained(linear), linear, 200)
    check_same_settings(trained(OptimConfig()), OptimConfig(), 200)
