"""The training run's monitor (translate.training.monitor): its log lines and progress bar."""

import math
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


def test_the_progress_bar_ends_where_the_time_limit_stops_the_run():
    """train.max_minutes coming first: the bar's end is the update the run reaches by then."""
    from translate.training.schedule import projected_end

    assert projected_end(step=10, first_step=0, max_steps=1000, elapsed=10.0, remaining=math.inf) == 1000  # no limit
    assert projected_end(step=10, first_step=0, max_steps=1000, elapsed=10.0, remaining=50.0) == 60  # 1 update/s
    assert projected_end(step=110, first_step=100, max_steps=1000, elapsed=5.0, remaining=1000.0) == 1000  # steps first
    assert projected_end(step=0, first_step=0, max_steps=1000, elapsed=0.0, remaining=50.0) == 1000  # no rate yet
    assert projected_end(step=30, first_step=0, max_steps=1000, elapsed=10.0, remaining=-1.0) == 30  # time is up


def test_the_progress_bar_is_paced_from_the_first_update_as_a_linear_decay_end_is(tmp_path, monkeypatch):
    """Start-up before the first update (memory, kernels, compilation) does not pull the bar's
    end in: it projects at the pace since the first update, as schedule.project_end does."""
    from types import SimpleNamespace

    from translate.core.config import TranslateConfig
    from translate.core.run_record import Compute, RunRecord
    from translate.training import monitor
    from translate.training.distributed import Context
    from translate.training.update import StepStats

    bar = SimpleNamespace(total=None, update=lambda n: None)
    monkeypatch.setattr(monitor, "_progress_bar", lambda total, initial: bar)
    monkeypatch.setattr(monitor, "_summary_writer", lambda folder: None)
    clock = [0.0]
    monkeypatch.setattr(monitor.time, "monotonic", lambda: clock[0])
    cfg = TranslateConfig()
    cfg.run_dir, cfg.train.max_steps = str(tmp_path), 10**6
    run = monitor.Monitor(cfg, Context(), None, record=RunRecord(), previous=Compute(), first_update=0, precision="fp32")
    clock[0] = 100.0  # 100 s of start-up, then the first update
    run.count(StepStats(), 1, deadline=1000.0)
    clock[0] = 110.0  # 10 more updates in 10 s: 1 update/s for the 890 s left
    run.count(StepStats(), 11, deadline=1000.0)
    assert bar.total == 11 + 890  # from the run's start (11 updates in 110 s) it would be 11 + 89
