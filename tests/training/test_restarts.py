"""torchrun's restarts (--max-restarts): a rank killed (SIGKILL) or stopped (SIGSTOP, which the
watchdog ends) mid-run, and the job recovers by itself: the restarted processes meet afresh in
the same agent's store, resume from the last whole checkpoint, and end where an uninterrupted
run of the same command ends, tensor for tensor."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import List

import pytest
import torch.distributed as dist

from tests.conftest import MULTI30K, RESUMABLE, ROOT, SMALL, TORCHRUN, free_port, hook_env, in_update, need, run
from translate.core.config import TranslateConfig
from translate.core.run_record import Restart, RunRecord, TrainingTotals
from translate.training import distributed
from translate.training.watchdog import Watchdog
from translate.verbs import table

sys.path.insert(0, str(ROOT / "scripts"))
from compare_trees import differences  # noqa: E402  (every tensor and value of two checkpoints)

STALL_TIMEOUT = 8  # seconds: what a silent rank is allowed before the other names it


def overrides(folder: Path, cache: str) -> List[str]:
    """15 updates of the small model, a checkpoint every 5, in folder/run."""
    return [*SMALL[:-2], *RESUMABLE, "train.max_steps=15", f"train.stall_timeout={STALL_TIMEOUT}",
            f"run_dir={folder / 'run'}", f"data.cache_dir={cache}"]


def restartable(*args: str) -> List[str]:
    """`translate ARGS` in two processes under torchrun, restarted up to twice."""
    return [*TORCHRUN, "--nproc_per_node=2", "--max-restarts=2", f"--master_port={free_port()}", "-m", "translate", *args]


def first_attempt_only(update: int, sent: str) -> str:
    """Rank 1 sends itself `sent` at the start of its `update`-th update, in torchrun's first
    attempt alone (a restarted one runs clean)."""
    return in_update(update, f"if os.environ.get('TORCHELASTIC_RESTART_COUNT') == '0':\n"
                             f"    os.kill(os.getpid(), signal.{sent})", rank=1)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, cache) -> Path:
    """checkpoint_last.pt of the same command, run without a fault."""
    need(MULTI30K)
    folder = tmp_path_factory.mktemp("uninterrupted")
    result = run(restartable("train", *overrides(folder, cache)), timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "run" / "checkpoint_last.pt"


KILLED_WHILE_SAVING = """
import os, signal
if os.environ.get("RANK") == "0" and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    import translate.checkpoint as c, translate.core.paths as p
    original = c.save
    def saving(path, payload):  # checkpoint_last.pt of update 10 half-written, then SIGKILL
        if path.name == "checkpoint_last.pt" and payload["step"] == 10:
            with p.atomic_write(path, binary=True) as file:
                file.write(b"half" * 1000)
                file.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        return original(path, payload)
    c.save = saving
"""


@pytest.mark.parametrize("sent, named", [
    ("SIGKILL", "died while"),
    # make test-slow, to keep the default suite under 10 minutes: the watchdog's wait, then the same restart
    pytest.param("SIGSTOP", "stopped answering", marks=pytest.mark.slow)])
def test_a_killed_or_stopped_rank_is_restarted_and_the_run_ends_as_an_uninterrupted_one(tmp_path, cache, uninterrupted,
                                                                                        sent, named):
    started = time.monotonic()
    result = run(restartable("train", *overrides(tmp_path, cache)), env=hook_env(tmp_path, first_attempt_only(8, sent)),
                 timeout=240)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("translate train: error: rank 1")]
    assert len(lines) == 1 and named in lines[0], result.stderr[-3000:]
    # Recovered at the first restart: no other error (a restarted group that cannot meet, or that
    # hears the previous attempt's processes, fails and costs a restart).
    assert [line for line in result.stderr.splitlines() if line.startswith("translate train: error:")] == lines
    assert "resuming from" in result.stderr and "at update 5" in result.stderr
    assert differences(tmp_path / "run" / "checkpoint_last.pt", uninterrupted) == []
    assert "torchrun's restart 1 of at most 2: resuming at update 5; the attempt before ended: rank 1" in result.stderr
    (restart,) = RunRecord.load(tmp_path / "run").restarts  # when, which attempt, from where, why
    assert (restart.attempt, restart.resumed_from) == (1, 5) and restart.cause.startswith("rank 1 (pid ")
    assert named in restart.cause and "stops too" not in restart.cause, restart.cause
    assert datetime.fromisoformat(restart.at).tzinfo is not None
    assert seconds < 60 + (STALL_TIMEOUT if sent == "SIGSTOP" else 0), seconds


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes: the restart is the test above's
def test_rank_0_killed_while_saving_is_restarted_and_its_half_written_checkpoint_removed(tmp_path, cache, uninterrupted):
    result = run(restartable("train", *overrides(tmp_path, cache)), env=hook_env(tmp_path, KILLED_WHILE_SAVING), timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0 (pid " in result.stderr and "died while " in result.stderr
    assert "the checkpoint of update 10 being written in the background" in result.stderr  # checkpoint.background
    assert "removed what a training killed while saving left half-written: .checkpoint_last.pt." in result.stderr
    assert [p.name for p in (tmp_path / "run").glob(".checkpoint*")] == []
    assert differences(tmp_path / "run" / "checkpoint_last.pt", uninterrupted) == []


def test_only_the_half_written_checkpoints_of_a_training_are_removed(tmp_path):
    from translate.checkpoint import remove_unfinished

    left = [".checkpoint_last.pt.k2j3h4g5", ".checkpoint_best.pt.abcdefgh", ".checkpoint_120.pt.x_y-z123"]
    kept = [".checkpoint_average.pt.abcdefgh", ".run_record.json.abcdefgh", "checkpoint_last.pt", ".checkpoint_x.pt.abcdefgh"]
    for name in left + kept:
        (tmp_path / name).write_bytes(b"half")
    assert remove_unfinished(tmp_path) == sorted(left)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)


def test_each_attempt_meets_in_keys_of_its_own():
    """torchrun's agent keeps one store for every attempt: the process group's rendezvous keys
    and the watchdog's beats of a restarted attempt are apart from the previous attempt's (where
    a dead process's address, or its last word, would be read as the new one's)."""
    assert distributed._store_prefix(attempt=0, before=0) == ""  # the first group as PyTorch makes it
    assert len({distributed._store_prefix(a, b) for a in range(3) for b in range(3)}) == 9


def test_a_restarted_watchdog_does_not_hear_the_previous_attempts_processes(monkeypatch):
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    before = Watchdog.for_job(distributed.Context(rank=1, world_size=2, attempt=0), timeout=60).start()
    before.failed("RuntimeError: the first attempt's")
    before.close()  # its last word: done, and why
    started = time.monotonic()
    line = Watchdog.for_job(distributed.Context(rank=0, world_size=2, attempt=1), timeout=0.5).explain()
    assert line is not None and line.startswith("rank 1 stopped answering"), line  # silent here: not the old word
    assert time.monotonic() - started < 5
    same = Watchdog.for_job(distributed.Context(rank=0, world_size=2, attempt=0), timeout=0.5).explain()
    assert same.startswith("rank 1 failed while starting: RuntimeError: the first attempt's"), same  # as its own attempt hears it


def test_a_restarted_attempt_says_why_the_one_before_ended():
    """From the previous attempt's last beats: the first error a process stopped with (without
    its own "rank N stops too"), else the first process that ended without a word."""
    store = dist.HashStore()
    previous = dist.PrefixStore("before/", store)

    def beat(rank: int, **word) -> None:
        previous.set(str(rank), json.dumps({"beat": 3, "doing": "update 8: forward and backward", "pid": 4242,
                                            "host": "node7", **word}))

    restarted = Watchdog(dist.PrefixStore("now/", store), rank=0, world_size=2, timeout=60, previous=previous)
    assert restarted.previous_cause() is None  # nothing said
    beat(1)
    beat(0, done=True)
    assert restarted.previous_cause() == "rank 1 (pid 4242 on node7) ended without a word while update 8: forward and backward"
    beat(0, done=True, failed="rank 1 (pid 4242 on node7) died while update 8: forward and backward; rank 0 stops too "
                              "(resume with the same command)")
    assert restarted.previous_cause() == "rank 1 (pid 4242 on node7) died while update 8: forward and backward"
    assert Watchdog(store, rank=0, world_size=2, timeout=60).previous_cause() is None  # the first attempt: none before


def test_the_table_shows_restarts_where_a_run_had_any(tmp_path):
    training = TrainingTotals(updates=100, seconds=60.0, model_flops=1e12, skipped_updates=0, device="cpu", processes=2,
                              precision="fp32")
    restart = Restart(attempt=1, at="2026-12-04T17:00:00+00:00", resumed_from=5, cause="rank 1 died")
    for name, restarts in (("calm", None), ("faulty", [restart, restart])):
        RunRecord(settings={"run_dir": str(tmp_path / name)}, training=training, restarts=restarts).save(tmp_path / name)
    cfg = TranslateConfig()
    cfg.table.runs = [str(tmp_path / "calm"), str(tmp_path / "faulty")]
    assert [row["restarts"] for row in table.table(cfg)] == [0, 2]
    cfg.table.runs = [str(tmp_path / "calm")]
    assert "restarts" not in table.table(cfg)[0]  # a column only where a run had restarts
