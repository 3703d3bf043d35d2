"""One training per run directory: a lock that the operating system releases when its process
ends, however it ends (kill -9 leaves no stale lock), and that says who holds it."""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from pathlib import Path
from typing import Optional

from translate.core import paths
from translate.core.errors import TranslateError

log = logging.getLogger(__name__)


class RunLock:
    """An exclusive flock on <run_dir>/train.lock, held by one process (rank 0 of a job) while
    it trains. The file's text names the holder: host, process id and start time. Readers
    (decode, bleu, average, export) never take it."""

    def __init__(self, run_dir: Path):
        self.path = paths.train_lock(run_dir)
        self.file: Optional[object] = None

    def acquire(self) -> None:
        """Hold the lock, or raise naming the run_dir and its holder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        file = open(self.path, "a+", encoding="utf-8")  # never truncated before the lock is ours
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held by another process
            file.seek(0)
            holder = file.read().strip() or "another process"
            file.close()
            raise TranslateError(f"{self.path.parent} is being trained by {holder}: one training per run_dir "
                                 "(wait for it, stop it, or choose another run_dir)") from None
        except OSError as error:  # a file system without locks (some network ones): train unguarded
            file.close()
            log.warning(f"cannot lock {self.path} ({error.strerror or error}): nothing keeps a second training "
                        "out of this run_dir")
            return
        file.seek(0)
        file.truncate()
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        file.write(f"host {socket.gethostname()} process {os.getpid()} since {started}\n")
        file.flush()
        self.file = file

    def release(self) -> None:
        """Let the next training in (the next job of a sweep in this process, say)."""
        if self.file is not None:
            self.file.close()  # closing the descriptor drops the flock
            self.file = None
