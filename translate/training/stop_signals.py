"""Stop signals (preemption, Ctrl-C) turned into a save and a clean exit at the next update:
the Trainer reads what was received between two updates (Trainer.between_updates)."""

from __future__ import annotations

import logging
import os
import signal
from typing import Dict, List, Optional

log = logging.getLogger(__name__)


def submitit_signal() -> Optional[int]:
    """In a submitit task, the signal submitit sends before SLURM's time limit and on preemption
    (SIGUSR2 unless SUBMITIT_PREEMPT_SIGNAL says otherwise; hydra.launcher.signal_delay_s before
    the limit); else None."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)


def stop_signal_numbers() -> List[int]:
    """SIGTERM, SIGUSR1 and SIGINT (Ctrl-C; torchrun passes it on to each worker); in a
    submitit task also submitit's signal (submitit_signal), whose own handler would end the
    task without a save: it is handed back to that handler after the save (StopSignals.close)."""
    numbers = [signal.SIGTERM, signal.SIGUSR1, signal.SIGINT]
    number = submitit_signal()
    if number is not None and number not in numbers:
        numbers.append(number)
    return numbers


class StopSignals:
    """SIGTERM and SIGUSR1 (what SLURM and cloud preemption send) and Ctrl-C ask for a save and
    a clean exit at the next update (see stop_signal_numbers); a second Ctrl-C exits at once,
    without saving. The previous handlers come back afterwards."""

    def __init__(self):
        self.received: Optional[int] = None
        self.previous: Dict[int, object] = {}
        try:
            for number in stop_signal_numbers():
                self.previous[number] = signal.signal(number, self._handle)
        except ValueError:  # not the main thread: leave signals alone
            self.close()

    @property
    def name(self) -> Optional[str]:
        return signal.Signals(self.received).name if self.received else None

    def _handle(self, number, frame) -> None:
        if number == signal.SIGINT and self.received == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: the user will not wait for the save
        self.received = number

    def how_to_resume(self) -> str:
        """What the stop line tells the user: submitit's signal requeues the job by itself (close);
        any other stop waits for the same command again."""
        if self.received is not None and self.received == submitit_signal():
            return "submitit requeues the job, which resumes from it"
        return "run the same command to resume"

    def close(self) -> None:
        """The previous handlers back. Where the stop was submitit's signal, it goes on to
        submitit's own handler, back now that the checkpoint is saved: in rank 0 that handler
        follows submitit's checkpoint protocol (the Hydra launcher's `checkpoint`: the same job,
        submitted again) and requeues the job, which resumes from checkpoint_last.pt; in the
        other ranks it does nothing."""
        for number, handler in self.previous.items():
            signal.signal(number, handler)
        handed_over = self.previous and self.received is not None and self.received == submitit_signal()
        self.previous = {}
        if handed_over:
            log.warning(f"stopped by {self.name} (submitit's preemption or time-limit signal) and saved: submitit "
                        "requeues the job, which resumes from checkpoint_last.pt")
            signal.raise_signal(self.received)
