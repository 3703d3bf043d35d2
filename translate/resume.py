"""What an exact resume needs besides the weights: every process's random state and data
position, and stop signals (preemption) turned into a save at the next update."""

from __future__ import annotations

import logging
import os
import signal
from typing import Dict, List, Optional

import torch

from translate import distributed
from translate.data.batching import BatchStream
from translate.validate import Tracker

log = logging.getLogger("translate.train")


def stop_signal_numbers() -> List[int]:
    """SIGTERM and SIGUSR1; in a submitit task also submitit's warning before SLURM's time
    limit (SIGUSR2 unless SUBMITIT_PREEMPT_SIGNAL says otherwise; hydra.launcher.signal_delay_s
    before it), whose own handler would end the task without a save."""
    numbers = [signal.SIGTERM, signal.SIGUSR1]
    if os.environ.get("SUBMITIT_EXECUTOR"):
        number = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)
        if number is not None and number not in numbers:
            numbers.append(number)
    return numbers


class StopSignals:
    """SIGTERM and SIGUSR1 (what SLURM and cloud preemption send; see stop_signal_numbers) ask
    for a save and a clean exit at the next update; the previous handlers come back afterwards."""

    def __init__(self):
        self.received: Optional[int] = None
        self.previous: Dict[int, object] = {}
        try:
            for number in stop_signal_numbers():
                self.previous[number] = signal.signal(number, self._handle)
        except ValueError:  # not the main thread: leave signals alone
            self.restore()

    @property
    def name(self) -> Optional[str]:
        return signal.Signals(self.received).name if self.received else None

    def _handle(self, number, frame) -> None:
        self.received = number

    def restore(self) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)
        self.previous = {}


def process_state(batches: BatchStream) -> Dict:
    state = {"torch": torch.get_rng_state(), "batches": batches.state_dict()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def gather_process_states(context: distributed.Context, batches: BatchStream) -> List[Dict]:
    """Every process's random state and data position (for an exact resume), on rank 0."""
    state = process_state(batches)
    if not context.distributed:
        return [state]
    states: List = [None] * context.world_size
    torch.distributed.all_gather_object(states, state)
    return states


def restore_process_state(payload: Dict, context: distributed.Context, batches: BatchStream, tracker: Tracker) -> None:
    states = payload.get("processes")
    if states is None or len(states) != context.world_size:
        log.warning("the checkpoint was written by another number of processes: data order and random state restart")
        return
    state = states[context.rank]
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    batches.load_state_dict(state["batches"])
    tracker.load_state_dict(payload.get("valid", {}))
