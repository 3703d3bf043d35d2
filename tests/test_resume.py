"""Training that survives: exact resume after SIGKILL, interrupted writes, SIGTERM,
non-finite updates, fine-tuning from another run, validation and early stopping."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import MULTI30K, ROOT, SMALL, need
from translate import checkpoint

BASE = SMALL[:-2] + ["train.log_every=1", "checkpoint.every_steps=5", "checkpoint.every_minutes=null", "valid.every_steps=0"]


def hook_env(tmp_path, code: str) -> dict:
    """An environment whose Python runs `code` at start-up (a sitecustomize of this test's own)."""
    folder = tmp_path / "hook"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(code)
    return dict(os.environ, PYTHONPATH=f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


def train(tmp_path, run, *extra, env=None, timeout=600):
    overrides = BASE + [f"run_dir={tmp_path / run}", f"data.cache_dir={tmp_path}/cache", *extra]
    return subprocess.run([sys.executable, "-m", "translate", "train", *overrides], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


KILL_ON_CALL = """
import os, signal
import translate.training.trainer as t
original, calls = t.train_step, []
def killing(*args, **kwargs):
    calls.append(1)
    if len(calls) == {call}:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(*args, **kwargs)
t.train_step = killing
"""


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_one(tmp_path):
    need(MULTI30K)
    hook = """
import os, signal
import translate.paths as c
original, calls = os.replace, []
def dying_replace(source, target):
    if str(target).endswith("checkpoint_last.pt"):
        calls.append(target)
    if len(calls) == 2:  # the second checkpoint_last.pt: killed after writing, before the rename
        os.kill(os.getpid(), signal.SIGKILL)
    return original(source, target)
c.os.replace = dying_replace
"""
    result = train(tmp_path, "run", "train.max_steps=12", env=hook_env(tmp_path, hook))
    assert result.returncode == -signal.SIGKILL
    assert checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")["step"] == 5  # the previous one, whole
    resumed = train(tmp_path, "run", "train.max_steps=12")
    assert resumed.returncode == 0, resumed.stderr
    assert checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")["step"] == 12


def test_sigterm_saves_and_exits_cleanly(tmp_path):
    need(MULTI30K)
    overrides = BASE + ["train.max_steps=100000", f"run_dir={tmp_path}/run", f"data.cache_dir={tmp_path}/cache"]
    process = subprocess.Popen([sys.executable, "-m", "translate", "train", *overrides], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (tmp_path / "run" / "checkpoint_5.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert time.monotonic() - sent < 30
    assert process.returncode == 1
    line = next(l for l in stderr.splitlines() if "error:" in l)
    assert "stopped by SIGTERM at update" in line and "run the same command to resume" in line
    step = int(line.split("at update ")[1].split(":")[0])
    assert checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")["step"] == step >= 5


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
    result = train(tmp_path, "run", "train.max_steps=6", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("non-finite loss or gradient, skipped") == 2
    payload = checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")
    assert payload["step"] == 6 and payload["skipped_updates"] == 2
    assert all(torch.isfinite(t).all() for t in payload["model"].values())


def test_the_skipped_update_count_carries_over_a_resume(tmp_path):
    need(MULTI30K)
    first = train(tmp_path, "run", "train.max_steps=6", env=hook_env(tmp_path, NAN_LOSS.format(condition="len(calls) in (3, 4)")))
    assert first.returncode == 0, first.stderr
    resumed = train(tmp_path, "run", "train.max_steps=8")
    assert resumed.returncode == 0, resumed.stderr
    payload = checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")
    assert payload["step"] == 8 and payload["skipped_updates"] == 2


def test_repeated_non_finite_updates_stop_the_run_clearly(tmp_path):
    need(MULTI30K)
    env = hook_env(tmp_path, NAN_LOSS.format(condition="len(calls) > 6"))
    result = train(tmp_path, "run", "train.max_steps=50", "train.max_nonfinite=4", env=env)
    assert result.returncode == 1
    line = next(l for l in result.stderr.splitlines() if "error:" in l)
    assert "4 non-finite updates in a row at update 7" in line and "checkpoint_last.pt" in line


def test_init_from_another_runs_weights(tmp_path):
    need(MULTI30K)
    assert train(tmp_path, "first", "train.max_steps=3").returncode == 0
    source = tmp_path / "first" / "checkpoint_last.pt"
    second = train(tmp_path, "second", "train.max_steps=1", f"train.init_from={source}", "optim.lr_scale=1e-12")
    assert second.returncode == 0, second.stderr
    assert "starting from the weights of" in second.stderr
    a, b = checkpoint.load(source), checkpoint.load(tmp_path / "second" / "checkpoint_last.pt")
    assert b["step"] == 1  # a fresh schedule
    assert all(torch.allclose(a["model"][n], b["model"][n], atol=1e-6) for n in a["model"])
    other = train(tmp_path, "third", "train.max_steps=1", f"train.init_from={source}", "model.d_ff=128")
    assert other.returncode == 1 and "different model (d_ff 64 != 128)" in other.stderr


def test_validation_keeps_the_best_and_stops_early(tmp_path):
    need(MULTI30K)
    result = train(tmp_path, "run", "train.max_steps=6", "valid.every_steps=2", "valid.bleu_sentences=20", "valid.metric=bleu")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("dev loss") == 3 and "bleu" in result.stderr
    best = checkpoint.load(tmp_path / "run" / "checkpoint_best.pt")
    assert best["step"] in (2, 4, 6) and "bleu" in best["dev"]
    # With (almost) no learning the dev loss never improves after the first validation.
    frozen = train(tmp_path, "frozen", "train.max_steps=20", "valid.every_steps=2", "valid.patience=2", "optim.lr_scale=1e-12")
    assert frozen.returncode == 0, frozen.stderr
    assert "early stopping at update 6" in frozen.stderr
    assert checkpoint.load(tmp_path / "frozen" / "checkpoint_last.pt")["valid"]["since_best"] == 2


def torchrun_training(tmp_path) -> subprocess.Popen:
    """Two processes under torchrun training in tmp_path/run, once checkpoint_5.pt is written."""
    need(MULTI30K)
    from tests.conftest import TORCHRUN, free_port

    overrides = BASE + ["train.max_steps=100000", f"run_dir={tmp_path}/run", f"data.cache_dir={tmp_path}/cache"]
    agent = subprocess.Popen([*TORCHRUN, "--nproc_per_node=2", f"--master_port={free_port()}", "-m", "translate", "train",
                              *overrides], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (tmp_path / "run" / "checkpoint_5.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return agent


def test_a_stop_signal_to_one_rank_is_agreed_by_all(tmp_path):
    """Under torchrun, SIGTERM to one worker: both stop at the same update, rank 0 saves the
    random state and data position of both, and a rerun resumes."""
    agent = torchrun_training(tmp_path)
    workers = subprocess.run(["pgrep", "-P", str(agent.pid)], capture_output=True, text=True).stdout.split()
    assert len(workers) == 2
    os.kill(int(sorted(workers, key=int)[-1]), signal.SIGTERM)  # one worker only
    _, stderr = agent.communicate(timeout=120)
    assert agent.returncode != 0
    assert "stopped by SIGTERM at update" in stderr and "stopped by a stop signal on another process" in stderr
    payload = checkpoint.load(tmp_path / "run" / "checkpoint_last.pt")
    assert payload["step"] >= 5 and len(payload["processes"]) == 2
    assert all(p["batches"]["position"] > 0 for p in payload["processes"])
    assert not torch.equal(payload["processes"][0]["torch"], payload["processes"][1]["torch"])  # each rank its own


def test_one_training_per_run_dir_and_readers_welcome(tmp_path):
    """A second training on a run_dir that trains exits at once naming the holder; decode
    (which builds the average while training prunes checkpoints) reads it meanwhile; after a
    kill -9 the lock is gone with its process."""
    need(MULTI30K)
    overrides = BASE + ["train.max_steps=100000", "checkpoint.every_steps=2", "checkpoint.keep_last=2",
                        f"run_dir={tmp_path}/run", f"data.cache_dir={tmp_path}/cache"]
    first = subprocess.Popen([sys.executable, "-m", "translate", "train", *overrides], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "run" / "checkpoint_4.pt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        second = train(tmp_path, "run", "train.max_steps=100000")
        assert second.returncode == 1
        line = next(l for l in second.stderr.splitlines() if "error:" in l)
        assert f"{tmp_path / 'run'} is being trained by host " in line and f"process {first.pid} " in line
        (tmp_path / "in.en").write_text("A dog runs.\nTwo men talk.\n", encoding="utf-8")
        decoded = subprocess.run([sys.executable, "-m", "translate", "decode", *overrides, "checkpoint.average_last=2",
                                  "decode.max_len_b=3", f"decode.input={tmp_path}/in.en"], cwd=ROOT, capture_output=True,
                                 text=True, timeout=300)
        assert decoded.returncode == 0, decoded.stderr
        assert (tmp_path / "run" / "checkpoint_average.pt").is_file()  # built while training pruned
        assert first.poll() is None  # still training
    finally:
        first.kill()
        first.wait()
    resumed = train(tmp_path, "run", "train.max_steps=1")  # the lock died with its process
    assert resumed.returncode == 0 and "nothing to do" in resumed.stderr


def test_the_lock_is_released_for_the_next_job_in_the_process(tmp_path):
    from translate.errors import TranslateError
    from translate.training.run_lock import RunLock

    first, second = RunLock(tmp_path), RunLock(tmp_path)
    first.acquire()
    with pytest.raises(TranslateError, match=f"process {os.getpid()} since"):
        second.acquire()
    first.release()
    second.acquire()  # a sweep's next job in the same process
    second.release()


SIGINT_ON_CALL = """
import os, signal
import translate.training.trainer as t
original, calls = t.train_step, []
def interrupting(*args, **kwargs):
    calls.append(1)
    if len(calls) == 8:
        for _ in range({times}):
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of update 8
    return original(*args, **kwargs)
t.train_step = interrupting
"""


def as_written_before_the_schedule_class(path) -> None:
    """Rewrite a checkpoint's schedule state as the LambdaLR that older checkpoints hold (its
    last_epoch counted the applied updates)."""
    from translate.training.schedule import InverseSquareRootSchedule

    payload = torch.load(path, map_location="cpu", weights_only=False)
    schedule = InverseSquareRootSchedule(32, 20)
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
    straight = train(tmp_path, "straight", "train.max_steps=12")
    assert straight.returncode == 0, straight.stderr
    killed = train(tmp_path, "killed", "train.max_steps=12", env=hook_env(tmp_path, KILL_ON_CALL.format(call=8)))
    assert killed.returncode == -signal.SIGKILL
    assert checkpoint.load(tmp_path / "killed" / "checkpoint_last.pt")["step"] == 5
    as_written_before_the_schedule_class(tmp_path / "killed" / "checkpoint_last.pt")
    stopped = train(tmp_path, "stopped", "train.max_steps=12", env=hook_env(tmp_path, SIGINT_ON_CALL.format(times=1)))
    assert stopped.returncode == 130, stopped.stderr
    assert "stopped by SIGINT at update 8: saved" in stopped.stderr
    assert checkpoint.load(tmp_path / "stopped" / "checkpoint_last.pt")["step"] == 8
    a = checkpoint.load(tmp_path / "straight" / "checkpoint_last.pt")
    for run in ("killed", "stopped"):
        resumed = train(tmp_path, run, "train.max_steps=12")
        assert resumed.returncode == 0 and "resuming from" in resumed.stderr, resumed.stderr
        b = checkpoint.load(tmp_path / run / "checkpoint_last.pt")
        assert a["step"] == b["step"] == 12
        for name in a["model"]:
            assert torch.equal(a["model"][name], b["model"][name]), (run, name)
        assert a["optimizer"]["state"][0]["exp_avg"].equal(b["optimizer"]["state"][0]["exp_avg"]), run


def test_a_second_ctrl_c_exits_at_once_without_saving(tmp_path):
    need(MULTI30K)
    twice = train(tmp_path, "twice", "train.max_steps=11", env=hook_env(tmp_path, SIGINT_ON_CALL.format(times=2)))
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
