"""The learning-rate schedule: the paper's (section 5.3: linear warmup, then inverse square root
decay), or the same warmup and peak, then a linear fall to zero at the last update
(train.max_steps, or the update a time limit is projected to reach: end_at, which
translate.training.time_limit calls). With optim.warmup_ratio, a run too short for the whole
warmup stops warming up at that share of its updates (cut_warmup), at the rate reached (or, with
optim.cut_peak_power below 1, at a higher peak up a steeper ramp), and decays from there."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

import torch
from torch import Tensor

from translate.core.choices import Decay


class LearningRateSchedule:
    """lrate = lr_scale * d_model^-0.5 * min(n^-0.5, n * warmup_steps^-1.5) for update n (from 1);
    with linear decay, the same warmup to the same peak, then peak * (last_update + 1 - n) /
    (last_update + 1 - warmup_steps): a run whose length is known ends its rate near zero, where the
    paper's keeps most of its peak (a budget of 4,000 updates after 2,000 of warmup: 71%).

    With warmup_ratio, the warmup lasts at most that share of the last update: a run that will
    not reach warmup_steps (a slow CPU's hour) climbs the same ramp, stops at the rate reached
    there (a lower peak: a short warmup to the full peak diverged, see docs/results.md "What did
    not help") and decays from it, so that it still anneals.
    With cut_peak_power p below 1, the cut warmup of w updates peaks higher instead, at the full
    peak * (w / warmup_steps)^p (p = 1: the rate reached; p = 0: the full peak), up a straight ramp
    from the knee: (0, 0), or under a time limit the update whose pace projected the cut and the
    rate it had (the rates already used stay). p = 0.5 is the ramp a Zen 1's hour was fitted with
    on dev (docs/results.md "A warmup cut to the run's length").

    It counts the updates applied so far in a device scalar, so that an update dropped on the
    device (a non-finite gradient, found without the host reading anything) leaves the count,
    and so the rate of the next update, where they were. The rate is a device scalar too, for
    the fused Adam kernel to read there: a row of a table of the updates' rates, computed on the
    host in Python floats (device arithmetic would round some rates differently), CHUNK rows at a
    time as the run reaches them (a run bounded by train.max_minutes may set train.max_steps to
    10^9: a table of every update would take minutes and gigabytes before the first one).
    """

    CHUNK = 100_000  # rows of the table computed at a time

    def __init__(self, d_model: int, warmup_steps: int, *, lr_scale: float = 1.0, last_update: int = 100000,
                 device: torch.device = torch.device("cpu"), decay: Decay = Decay.inverse_sqrt,
                 warmup_ratio: Optional[float] = None, cut_peak_power: float = 1.0):
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps ({warmup_steps}) must be at least 1")
        if warmup_ratio is not None and not 0 < warmup_ratio <= 1:
            raise ValueError(f"warmup_ratio ({warmup_ratio}) must be in (0, 1]")
        if not 0 <= cut_peak_power <= 1:
            raise ValueError(f"cut_peak_power ({cut_peak_power}) must be in [0, 1]")
        self.d_model, self.warmup_steps, self.lr_scale = d_model, warmup_steps, lr_scale
        self.decay = Decay(decay)
        self.last_update = last_update  # the last update planned (train.max_steps, or end_at's)
        self.projected = False  # whether last_update is a time limit's projection (end_at), not train.max_steps
        self.warmup_ratio = warmup_ratio
        self.warmup_cut = False  # whether a time limit's projection has set self.warmup (cut_warmup)
        self.cut_peak_power = cut_peak_power
        self.knee: Tuple[int, float] = (0, 0.0)  # (update, its rate): where a steeper ramp to a cut warmup's peak starts
        # CUDA's fused Adam reads a float32 rate; elsewhere float64 is the Python float exactly.
        self.dtype, self.device = (torch.float32 if device.type == "cuda" else torch.float64), device
        self.applied = torch.zeros(1, dtype=torch.long, device=device)  # (1,) updates applied so far
        self.counted = 0  # steps counted on the host: never fewer than the applied updates
        # Where the warmup ends: warmup_steps, or earlier, at warmup_ratio of train.max_steps (and
        # again, under a time limit, of the update it is projected to reach: cut_warmup).
        self.warmup = warmup_steps if warmup_ratio is None else self._cut(last_update)
        self._start_table(0)

    def rate_at(self, n: int) -> float:
        """The learning rate of update n."""
        n = max(n, 1)
        scale = self.lr_scale * self.d_model**-0.5
        if self.warmup < self.warmup_steps and n > self.warmup:  # a cut warmup: decay from its peak
            peak = self.cut_peak()
            if self.decay == Decay.linear:
                return peak * max(self.last_update + 1 - n, 0) / max(self.last_update + 1 - self.warmup, 1)
            return peak * (self.warmup / n) ** 0.5
        if self.warmup < self.warmup_steps and self.cut_peak_power != 1:  # the steeper ramp, through the knee
            (knee, knee_rate), peak = self.knee, self.cut_peak()
            if n <= knee:  # the ramp those rates were used on: a line from (0, 0)
                return knee_rate * n / knee
            return knee_rate + (peak - knee_rate) * (n - knee) / (self.warmup - knee)
        if self.decay == Decay.linear and n > self.warmup_steps:
            peak = scale * self.warmup_steps**-0.5
            return peak * max(self.last_update + 1 - n, 0) / max(self.last_update + 1 - self.warmup_steps, 1)
        return scale * min(n**-0.5, n * self.warmup_steps**-1.5)

    def cut_peak(self) -> float:
        """The rate a cut warmup ends at: the full peak * (warmup / warmup_steps)^cut_peak_power (with
        1, the rate the paper's ramp reaches there), and never below the knee's, already used."""
        scale = self.lr_scale * self.d_model**-0.5
        if self.cut_peak_power == 1:
            return scale * self.warmup * self.warmup_steps**-1.5  # the paper's ramp's rate, to the last bit
        peak = scale * self.warmup_steps**-0.5 * (self.warmup / self.warmup_steps) ** self.cut_peak_power
        return peak if self.warmup > self.knee[0] else self.knee[1]

    def _cut(self, last_update: int, updates: int = 0) -> int:
        """Where the warmup ends for a run whose last update is `last_update`: warmup_ratio of it,
        if that comes before warmup_steps, and not before the `updates` made (nor those counted)."""
        assert self.warmup_ratio is not None
        return min(self.warmup_steps, max(round(self.warmup_ratio * last_update), updates, self.counted, 1))

    def open_ended(self, updates: int) -> bool:
        """Whether, after `updates`, a time limit may set where the line ends (end_at): a linear
        decay not ended so yet, at the warmup's end, whose rates do not depend on the end."""
        return self.decay == Decay.linear and not self.projected and updates >= self.warmup

    def cuttable(self, updates: int) -> bool:
        """Whether, after `updates`, a time limit may set where the warmup ends (cut_warmup): a
        warmup_ratio, not applied to a projection yet, and the warmup not over. The ramp's rates
        do not depend on where it stops, so no rate already used changes."""
        return self.warmup_ratio is not None and not self.warmup_cut and updates < self.warmup

    def cut_warmup(self, last_update: int, updates: int) -> int:
        """End the warmup at warmup_ratio of `last_update` (the update a time limit is projected to
        reach), or after `updates` (those made) if that is later. Returns where it ends. A steeper
        ramp (cut_peak_power below 1) bends at `updates`, from the rate used there."""
        warmup = min(self.warmup, self._cut(last_update, updates))
        if warmup < self.warmup and updates > 0:
            self.knee = (updates, self.rate_at(updates))
        self.warmup, self.warmup_cut = warmup, True
        self._restart_table()
        return self.warmup

    def end_at(self, last_update: int) -> None:
        """End the linear decay at `last_update` instead (the update a time limit is projected
        to reach). Called at the end of the warmup, whose rates do not depend on the end: no rate
        already used changes."""
        self.last_update, self.projected = last_update, True
        self._restart_table()

    def _restart_table(self) -> None:
        """The table again from a few steps before the counted ones (step_back may go back to
        them), within the table: after the end or the warmup changed, or a state was loaded."""
        self._start_table(min(max(self.counted - 16, 0), self.last_update))

    def _start_table(self, base: int) -> None:
        """The table from row `base` (the rate of update base + 1) on: a run resumed far into
        its schedule computes no row it has passed."""
        self.base = base
        self.rates = torch.zeros(0, dtype=self.dtype, device=self.device)  # (rows,): row i, the rate of update base + i + 1
        self._cover()

    def _cover(self) -> None:
        """Extend the table past the next update the host has counted, up to its last row (the
        rate one past train.max_steps: the rate of any update after it)."""
        last = self.last_update + 1  # rows in the whole table
        while self.base + len(self.rates) <= self.counted + 1 and self.base + len(self.rates) < last:
            start = self.base + len(self.rates) + 1  # the update of the first new row
            stop = min(last, self.base + len(self.rates) + self.CHUNK) + 1
            more = torch.tensor([self.rate_at(n) for n in range(start, stop)], dtype=self.dtype, device=self.device)
            self.rates = torch.cat([self.rates, more])

    def rate(self) -> Tensor:
        """The learning rate of the next update: a () device scalar, nothing read back."""
        self._cover()
        row = (self.applied - self.base).clamp(0, len(self.rates) - 1)  # (1,) past the table: its last rate
        return self.rates.index_select(0, row).squeeze(0)

    def step(self, dropped: Union[bool, Tensor] = False) -> None:
        """Count the update just made; where `dropped` (a device flag) is set, it did not count."""
        self.applied += 1
        self.counted += 1
        self.step_back(dropped)

    def step_back(self, where: Union[bool, Tensor] = True) -> None:
        """Take back one step (where `where` is set): the rate is again exactly what it was."""
        self.applied -= torch.as_tensor(where, device=self.applied.device).long()

    def state_dict(self) -> Dict[str, Any]:
        """Plain numbers: the applied updates (read from the device) and the settings; the last
        update is saved as "updates"."""
        return {"applied": int(self.applied.item()), "d_model": self.d_model, "warmup_steps": self.warmup_steps,
                "lr_scale": self.lr_scale, "decay": str(self.decay), "updates": self.last_update,
                "projected": self.projected, "warmup": self.warmup, "warmup_cut": self.warmup_cut,
                "knee": list(self.knee)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Our own state, or that of the LambdaLR that checkpoints written before this class
        hold (its last_epoch counted the applied updates the same way)."""
        self.counted = int(state["applied"] if "applied" in state else state["last_epoch"])
        self.applied.fill_(self.counted)
        if state.get("projected") and self.decay == Decay.linear:  # the end the saved run projected stays
            self.last_update, self.projected = min(int(state["updates"]), self.last_update), True
        if self.warmup_ratio is not None and state.get("warmup_cut"):  # where the saved run's warmup ended stays
            self.warmup, self.warmup_cut = min(int(state["warmup"]), self.warmup), True
            knee = state.get("knee", (0, 0.0))  # none saved before cut_peak_power: the ramp from (0, 0)
            self.knee = (int(knee[0]), float(knee[1]))
        self._restart_table()

