"""The training run's monitor (translate.training.monitor): its log lines and progress bar."""

import re

from tests.conftest import MULTI30K, need, run_cli, small_run


def test_logs_account_for_compute(tmp_path):
    need(MULTI30K)
    result = run_cli("train", *small_run(tmp_path, "train.max_steps=2", "train.log_every=1"))
    assert result.returncode == 0, result.stderr
    assert "GFLOP per target token" in result.stderr
    update = next(line for line in result.stderr.splitlines() if "] - update 2:" in line)
    assert " mfu " in update and " mem " in update and " FLOPs" in update
    # The peak the MFU divides by, its dtype, and the start-ups on this machine it is the best of.
    assert re.search(r" of [0-9.]+ TFLOP/s fp32 peak( \(best of \d+ start-ups\))? mem ", update), update


def test_the_progress_bar_ends_where_the_time_limit_projects_the_end(tmp_path, monkeypatch):
    """The bar's end is the time limit's projected end, at its pace since the first update."""
    from types import SimpleNamespace

    from translate.core.config import TranslateConfig
    from translate.core.run_record import Compute, RunRecord
    from translate.training import monitor, time_limit
    from translate.training.distributed import Context
    from translate.training.update import StepStats

    bar = SimpleNamespace(total=None, update=lambda n: None)
    monkeypatch.setattr(monitor, "_progress_bar", lambda total, initial: bar)
    monkeypatch.setattr(monitor, "_summary_writer", lambda folder: None)
    clock = [0.0]
    monkeypatch.setattr(time_limit.time, "monotonic", lambda: clock[0])
    cfg = TranslateConfig()
    cfg.run_dir, cfg.train.max_steps = str(tmp_path), 10**6
    limit = time_limit.TimeLimit(1000 / 60, first_update=0)  # 1,000 s from 0
    run = monitor.Monitor(cfg, Context(), None, record=RunRecord(), previous=Compute(), time_limit=limit, precision="fp32")
    clock[0] = 100.0  # 100 s of start-up, then the first update
    limit.count(1)
    run.count(StepStats(), 1)
    clock[0] = 110.0  # 10 more updates in 10 s: 1 update/s for the 890 s left
    limit.count(11)
    run.count(StepStats(), 11)
    assert bar.total == 11 + 890
