"""train.max_minutes (translate.training.time_limit): the pace of a run, the update its time limit
is projected to reach, and a linear decay ended there."""

import math

import pytest

from translate.core.choices import Decay
from translate.training import time_limit
from translate.training.distributed import Context
from translate.training.schedule import LearningRateSchedule
from translate.training.time_limit import TimeLimit, projected_end


def test_the_projected_end_is_where_the_time_limit_stops_the_run():
    """train.max_minutes coming first: the end is the update the run reaches by then."""
    assert projected_end(step=10, first_step=0, max_steps=1000, elapsed=10.0, remaining=math.inf) == 1000  # no limit
    assert projected_end(step=10, first_step=0, max_steps=1000, elapsed=10.0, remaining=50.0) == 60  # 1 update/s
    assert projected_end(step=110, first_step=100, max_steps=1000, elapsed=5.0, remaining=1000.0) == 1000  # steps first
    assert projected_end(step=0, first_step=0, max_steps=1000, elapsed=0.0, remaining=50.0) == 1000  # no rate yet
    assert projected_end(step=30, first_step=0, max_steps=1000, elapsed=10.0, remaining=-1.0) == 30  # time is up
    with pytest.raises(TypeError):
        projected_end(10, 0, 1000, 10.0, 50.0)  # five numbers side by side: each by its name


@pytest.fixture
def clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(time_limit.time, "monotonic", lambda: now[0])
    return now


def test_the_pace_is_measured_from_the_first_update_counted(clock):
    """Start-up before the first update (memory, kernels, compilation) does not pull the end in;
    before a second update is counted, the pace is the run's since its start."""
    limit = TimeLimit(1000 / 60, first_update=0)  # 1,000 s
    clock[0] = 100.0  # 100 s of start-up, then the first update
    limit.count(1)
    assert limit.pace(1) == (0, 0.0)
    clock[0] = 110.0  # 10 more updates in 10 s: 1 update/s for the 890 s left
    limit.count(11)  # a later count leaves the pace's start where it was
    assert limit.pace(11) == (1, 100.0)
    assert limit.projected_end(11, last_update=10**6) == 11 + 890  # from the run's start: 11 + 89
    assert limit.projected_end(11, last_update=500) == 500
    assert not limit.reached()
    clock[0] = 1001.0  # past the limit
    assert limit.reached()


def test_no_limit_never_ends_the_run_nor_the_line(clock):
    limit = TimeLimit(None, first_update=5)
    limit.count(6)
    clock[0] = 10.0**9
    assert not limit.reached() and limit.projected_end(7, last_update=80) == 80
    assert not limit.projects(LearningRateSchedule(64, 2, last_update=80, decay=Decay.linear), 7)


def test_a_linear_decay_ends_where_the_limit_is_projected_once_warmed_up(clock):
    """At the warmup's end (not before, and once), the line's end becomes the projected update;
    the paper's decay has no end to set."""
    limit = TimeLimit(100 / 60, first_update=0)  # 100 s
    schedule = LearningRateSchedule(64, 4, last_update=10**6, decay=Decay.linear)
    clock[0] = 1.0
    limit.count(1)
    clock[0] = 4.0  # 3 updates in 3 s: 96 more by the limit
    assert not limit.projects(schedule, 3) and limit.projects(schedule, 4)
    assert limit.project(schedule, 4, Context()) == 4 + 96
    assert schedule.last_update == 100 and schedule.projected and not limit.projects(schedule, 5)
    assert not limit.projects(LearningRateSchedule(64, 4, last_update=10**6), 4)


def test_a_warmup_ratio_ends_the_warmup_at_its_share_of_the_projected_run(clock):
    """optim.warmup_ratio under a time limit: once the first updates give a pace (5 of a 10-update
    warmup), the warmup ends at the ratio of the projected end, once; then, at that end, the
    linear decay's end is projected as without a ratio. A run long enough for the whole warmup
    keeps it."""
    limit = TimeLimit(13 / 60, first_update=0)  # 13 s
    schedule = LearningRateSchedule(64, 10, last_update=10**6, decay=Decay.linear, warmup_ratio=0.25)
    assert schedule.warmup == 10  # train.max_steps far away: the whole warmup so far
    clock[0] = 1.0
    limit.count(1)
    clock[0] = 5.0  # 4 updates in 4 s: 8 more by the limit
    assert not limit.projects(schedule, 4) and limit.projects(schedule, 5)
    assert limit.project(schedule, 5, Context()) == 5 + 8
    assert schedule.warmup == 5 and schedule.warmup_cut and schedule.last_update == 10**6  # round(0.25 * 13) = 3: not before now
    assert not schedule.cuttable(5) and limit.projects(schedule, 5)  # the warmup's end: the line's end is due
    limit.project(schedule, 5, Context())
    assert schedule.projected and schedule.last_update == 13
    long_run = LearningRateSchedule(64, 10, last_update=10**6, decay=Decay.linear, warmup_ratio=0.25)
    clock[0] = 1.0 + 4 * 0.01  # 4 updates in 0.04 s: far more than 40 updates by the limit
    limit.project(long_run, 5, Context())
    assert long_run.warmup == 10 and long_run.warmup_cut
    assert not TimeLimit(None, first_update=0).projects(
        LearningRateSchedule(64, 10, last_update=10**6, warmup_ratio=0.25), 5)  # no limit: train.max_steps alone
