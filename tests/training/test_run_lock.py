"""One training per run_dir (translate.training.run_lock): a second one is refused naming the
holder, readers are welcome meanwhile, and the lock ends with its process or its job."""

import os
import subprocess

import pytest

from tests.conftest import MULTI30K, RESUMABLE, cli, need, run_cli, small_run, start, train_resumable, wait_for


def test_one_training_per_run_dir_and_readers_welcome(tmp_path):
    """A second training on a run_dir that trains exits at once naming the holder; decode
    (which builds the average while training prunes checkpoints) reads it meanwhile; after a
    kill -9 the lock is gone with its process."""
    need(MULTI30K)
    overrides = small_run(tmp_path, *RESUMABLE, "train.max_steps=100000", "checkpoint.every_steps=2", "checkpoint.keep_last=2")
    first = start(cli("train", *overrides), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(tmp_path / "run" / "checkpoint_4.pt")
        second = train_resumable(tmp_path, "run", "train.max_steps=100000")
        assert second.returncode == 1
        line = next(l for l in second.stderr.splitlines() if "error:" in l)
        assert f"{tmp_path / 'run'} is being trained by host " in line and f"process {first.pid} " in line
        (tmp_path / "in.en").write_text("A dog runs.\nTwo men talk.\n", encoding="utf-8")
        decoded = run_cli("decode", *overrides, "checkpoint.average_last=2", "decode.max_len_b=3",
                          f"decode.input={tmp_path}/in.en", timeout=300)
        assert decoded.returncode == 0, decoded.stderr
        assert (tmp_path / "run" / "checkpoint_average.pt").is_file()  # built while training pruned
        assert first.poll() is None  # still training
    finally:
        first.kill()
        first.wait()
    resumed = train_resumable(tmp_path, "run", "train.max_steps=1")  # the lock died with its process
    assert resumed.returncode == 0 and "nothing to do" in resumed.stderr


def test_the_lock_is_released_for_the_next_job_in_the_process(tmp_path):
    from translate.core.errors import TranslateError
    from translate.training.run_lock import RunLock

    first, second = RunLock(tmp_path), RunLock(tmp_path)
    first.acquire()
    with pytest.raises(TranslateError, match=f"process {os.getpid()} since"):
        second.acquire()
    first.release()
    second.acquire()  # a sweep's next job in the same process
    second.release()
