"""train.max_minutes: when the run stops (its deadline), the pace of its updates, and the update
the limit is projected to reach at that pace: the progress bar's end, where a linear decay ends
(optim.decay=linear), projected once, at the warmup's end, and where optim.warmup_ratio ends the
warmup, projected once, from the first updates' pace."""

from __future__ import annotations

import logging
import math
import time
from typing import Optional, Tuple

from translate.training import distributed
from translate.training.schedule import LearningRateSchedule

log = logging.getLogger(__name__)


class TimeLimit:
    """The deadline of train.max_minutes (none: inf) and this run's pace: measured from its first
    update counted, so that start-up (memory, kernels, compilation) does not slow it, and from
    the run's start until a later update is counted."""

    WARMUP_PACE = 50  # updates whose pace projects where optim.warmup_ratio ends the warmup (fewer for a shorter warmup)

    def __init__(self, minutes: Optional[float], *, first_update: int):
        self.started = time.monotonic()
        self.deadline = self.started + 60 * minutes if minutes else math.inf  # monotonic time
        self.first_update = first_update  # where this run's loop began
        self.paced_from: Optional[Tuple[int, float]] = None  # (updates, time) when this run's first update was counted

    def count(self, updates: int) -> None:
        """One more update counted (updates: the count now)."""
        if self.paced_from is None:
            self.paced_from = (updates, time.monotonic())

    def reached(self) -> bool:
        return time.monotonic() >= self.deadline

    def pace(self, updates: int) -> Tuple[int, float]:
        """(updates, monotonic time) to measure the pace from, `updates` counted: after this run's
        first update, where a later one has been counted; else from its start."""
        if self.paced_from is not None and self.paced_from[0] < updates:
            return self.paced_from
        return self.first_update, self.started

    def projected_end(self, updates: int, *, last_update: int) -> int:
        """The update the run ends at, `updates` counted: `last_update`, or where the time limit
        comes first, the update reached by then at this run's pace."""
        (first, since), now = self.pace(updates), time.monotonic()
        return projected_end(step=updates, first_step=first, max_steps=last_update, elapsed=now - since,
                             remaining=self.deadline - now)

    def projects(self, schedule: LearningRateSchedule, updates: int) -> bool:
        """Whether, after `updates`, the time limit is due to set where the schedule's warmup ends
        (optim.warmup_ratio, once the first updates give a pace) or its linear decay (project)."""
        return self.deadline < math.inf and (schedule.open_ended(updates) or (
            schedule.cuttable(updates) and updates >= min(self.WARMUP_PACE, max(schedule.warmup_steps // 2, 2))))

    def project(self, schedule: LearningRateSchedule, updates: int, context: distributed.Context) -> int:
        """End the schedule's warmup at optim.warmup_ratio of the update the time limit is projected
        to reach, or its linear decay there (or at its current end if earlier), whichever is due:
        the main process's projection, on every process. Returns the projected end."""
        first = self.pace(updates)[0]
        end = max(int(distributed.from_main(self.projected_end(updates, last_update=schedule.last_update), context)),
                  updates)
        if schedule.cuttable(updates):
            warmup = schedule.cut_warmup(end, updates)
            log.info(f"optim.warmup_ratio={schedule.warmup_ratio}: the time limit is projected to end the run at update "
                     f"{end} (the pace of updates {first + 1}-{updates}); the warmup ends at update {warmup}, at rate "
                     f"{schedule.rate_at(warmup):.6g}")
            return end
        schedule.end_at(end)
        log.info(f"optim.decay=linear: the time limit is projected to end the run at update {end} (the pace of "
                 f"updates {first + 1}-{updates}); the rate falls to zero there, and training stops there")
        return end


def projected_end(*, step: int, first_step: int, max_steps: int, elapsed: float, remaining: float) -> int:
    """The last update: train.max_steps, or, where train.max_minutes comes first, the update the
    run will reach by then at its rate so far (step: updates now; first_step: when the pace is
    measured from; elapsed and remaining: seconds since then and up to the time limit)."""
    done = step - first_step
    if done < 1 or elapsed <= 0 or remaining == math.inf:
        return max_steps
    return min(max_steps, step + int(done / elapsed * max(remaining, 0.0)))
