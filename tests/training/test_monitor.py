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
