"""Checkpoints written while training goes on (checkpoint.background): the main thread takes a
copy of what is to be saved, a thread writes it.

A save at the big model's size writes about 2.5 GB (weights and Adam's two moments) with
fsync, which stops training for seconds to minutes, depending on the disk (docs/reliability.md).
The copy in memory takes a fraction of that; the file is written exactly as a foreground save
writes it (checkpoint.save: a temporary file renamed over the old one once on disk), so a kill
in the middle of a write still leaves the previous checkpoint whole.

One write at a time: a save waits for the previous one first, so files land in the order they
were saved and at most one copy is held. A failed write is raised on the main thread, at the
next save or wait; every way out of training waits (Trainer.run, Trainer.cleanup)."""

from __future__ import annotations

import copy
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from translate import checkpoint
from translate.training.distributed import Activity

Payload = Dict[str, Any]
log = logging.getLogger(__name__)


@dataclass
class Pending:
    """A write under way: its thread, what it is to do after, and what it raised."""

    thread: threading.Thread
    after: Optional[Callable[[], None]]  # run on the main thread once the files are written
    error: List[BaseException]  # what the thread raised, if anything


class CheckpointWriter:
    """Writes checkpoint files in a background thread (background=True) or at once."""

    def __init__(self, background: bool, activity: Optional[Activity] = None) -> None:
        self.background = background
        self.activity = activity if activity is not None else Activity()  # the watchdog names a write under way
        self.pending: Optional[Pending] = None

    def save(self, files: List[Tuple[Path, Payload]], after_files: Optional[Callable[[], None]] = None,
             after: Optional[Callable[[], None]] = None, what: str = "a checkpoint") -> None:
        """Write each (path, payload) in order (checkpoint.save), then call after_files (in the
        writer's thread: deleting old checkpoints, say), then `after` on the main thread (at
        once in the foreground, else at the next poll or wait). In the background, the payloads
        are copied first, so that training may change its weights meanwhile."""
        self.wait()
        if not self.background:
            _write(files, after_files)
            if after is not None:
                after()
            return
        # deepcopy keeps what torch.save keeps: tensors that share a storage (tied embeddings,
        # views) still share one in the copy, so the file is byte for byte a foreground save's.
        copies, errors = copy.deepcopy(files), []

        def write() -> None:
            try:
                _write(copies, after_files)
            except BaseException as error:  # raised on the main thread by wait()
                errors.append(error)
            finally:
                self.activity.writing = ""

        self.activity.writing = what
        thread = threading.Thread(target=write, name="checkpoint-writer", daemon=True)
        self.pending = Pending(thread, after, errors)
        thread.start()

    def poll(self) -> None:
        """Finish a write that has ended (its `after`, or its error), without waiting."""
        if self.pending is not None and not self.pending.thread.is_alive():
            self.wait()

    def wait(self) -> None:
        """Wait for the write under way, if any; run its `after`, or raise what it raised."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        pending.thread.join()
        if pending.error:
            raise pending.error[0]
        if pending.after is not None:
            pending.after()

    def close(self) -> None:
        """Wait for the write under way at the end of a run, however it ended: a failed write is
        logged, not raised (the run's own error, if any, is the one on its way out)."""
        try:
            self.wait()
        except Exception as error:
            log.error(f"the checkpoint being written when the run ended was not: {error}")


def _write(files: List[Tuple[Path, Payload]], after_files: Optional[Callable[[], None]]) -> None:
    for path, payload in files:
        checkpoint.save(path, payload)
    if after_files is not None:
        after_files()
