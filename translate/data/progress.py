"""Progress of a long pass over a corpus: a bar on a terminal, else a log line every few million pairs."""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional


class Progress:
    """Pairs done of the total, rate and time left."""

    def __init__(self, total: int, what: str, log: Callable[[str], None], every: int = 2_000_000,
                 terminal: Optional[bool] = None):
        self.total, self.what, self.log, self.every = total, what, log, every
        self.done, self.next_line, self.started = 0, every, time.monotonic()
        self.bar = None
        if sys.stderr.isatty() if terminal is None else terminal:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=what, unit="pair", unit_scale=True, dynamic_ncols=True)

    def update(self, pairs: int) -> None:
        self.done += pairs
        if self.bar is not None:
            self.bar.update(pairs)
        elif self.done >= self.next_line:
            self.next_line += self.every
            self.log(self.line())

    def line(self) -> str:
        seconds = max(time.monotonic() - self.started, 1e-9)
        rate = self.done / seconds
        left = (self.total - self.done) / rate if rate else float("inf")
        return (f"{self.what}: {self.done:,} of {self.total:,} pairs ({self.done / max(self.total, 1):.0%}), "
                f"{rate:,.0f} pairs/s, {left / 60:.1f} min left")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
