"""The processes of a job watch each other, so that none waits forever for one that died or
stopped answering.

A collective operation (an all-reduce of gradients, the per-update agreement, the gather of
random states at a checkpoint) waits for every process. Where one is gone, gloo and NCCL
either fail at once (a closed connection) or wait for their own timeout (30 minutes), and a
stopped process (SIGSTOP, a frozen node) looks alive to them. So each process also beats: a
thread writes a counter and what the process is doing ("update 57: forward and backward") to
the job's store (torchrun's, or rank 0's) at each change of phase and every second, and reads
the others' every second. A process whose
counter has not moved for train.stall_timeout seconds has stalled: every other process prints
one line naming it and what it was doing, ends it where it runs on the same host, and exits
non-zero at once; the checkpoints already written are whole (written atomically), so the same
command resumes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Dict, Optional, Tuple

import torch.distributed as dist

from translate.training import distributed

STALLED_EXIT = 1  # the exit code of a process that stops because another stalled


@dataclass
class Peer:
    """What this process last heard of another."""

    beat: int = -1  # its counter
    heard: float = 0.0  # when the counter last moved (this process's monotonic clock)
    doing: str = "starting"
    pid: int = 0
    host: str = ""
    done: bool = False  # it has ended its part of the job: silent, not stalled
    failed: str = ""  # the error it stopped with, if it did
    failed_while: str = ""  # what it was doing then

    def where(self) -> str:
        """' (pid P on HOST)' where its beats said, else nothing."""
        return f" (pid {self.pid} on {self.host})" if self.pid else ""


class Watchdog:
    """Heartbeats through the job's store, in a thread of each process of a distributed job.

    What this process is doing, the beats carry from its Activity (the Context's), which the
    trainer sets at each phase. stalled() is the line for a peer that has not beaten for `timeout`
    seconds, if any; the thread itself ends the process with that line (STALLED_EXIT), since
    the main thread may be waiting inside a collective that never returns. explain() names the
    peer behind a collective that failed (a closed connection: a process that died)."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout: float, interval: float = 1.0,
                 activity: Optional[distributed.Activity] = None, previous: Optional[dist.Store] = None):
        self.store, self.rank, self.world_size = store, rank, world_size
        self.previous = previous  # the beats of torchrun's attempt before this one, if this is a restart
        self.timeout, self.interval = timeout, interval
        self.activity = activity if activity is not None else distributed.Activity()
        self.peers: Dict[int, Peer] = {r: Peer(heard=time.monotonic()) for r in range(world_size) if r != rank}
        self.beat = 0
        self.failure: Dict[str, str] = {}  # this process's error, in its beats once it has one
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="translate-watchdog", daemon=True)

    @classmethod
    def for_job(cls, context: distributed.Context, timeout: float) -> "Watchdog":
        """The watchdog of this process of the job, on a connection of its own to the job's store
        (MASTER_ADDR:MASTER_PORT, which torchrun's agent or rank 0 serves), its keys apart for
        each job of a sweep and each of torchrun's restarts: the beats of a previous attempt's
        processes (done, failed, or a dead process id) would otherwise speak for this one's."""
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=max(timeout, 30.0)),
                              wait_for_workers=False)

        def beats(attempt: int) -> dist.Store:
            return dist.PrefixStore(f"translate-watchdog-{attempt}-{context.job}/", store)

        return cls(beats(context.attempt), context.rank, context.world_size, timeout, activity=context.activity,
                   previous=beats(context.attempt - 1) if context.attempt else None)

    def start(self) -> "Watchdog":
        self.thread.start()
        return self

    def close(self, seconds: float = 5.0) -> None:
        """Stop beating, and tell the others that this process is done (its silence from now on
        is no stall)."""
        self.stop.set()
        self.activity.changed.set()  # wakes the thread now
        self.thread.join(seconds)
        self._last_word()

    def _last_word(self) -> None:
        """Done, and the error this process stops with, if any: the others, and the processes of
        a restarted attempt (previous_cause), read it."""
        try:
            self.store.set(str(self.rank), json.dumps({"beat": self.beat + 1, "doing": "done", "done": True, **self.failure}))
        except Exception:  # the store's server has ended already: no one is left to tell
            pass

    def previous_cause(self) -> Optional[str]:
        """In a restarted attempt: why the attempt before it ended, as its processes' last beats
        say. The first error one of them stopped with (the line naming a peer that died or
        stalled, from the peer that saw it), else the first that ended without a word (killed)
        and what it was doing; None where none of them says."""
        if self.previous is None:
            return None
        words = {}
        try:
            for rank in range(self.world_size):
                if self.previous.check([str(rank)]):
                    words[rank] = json.loads(self.previous.get(str(rank)))
        except Exception:  # the store's server is gone: nothing more is known
            pass
        for rank, word in words.items():
            if word.get("failed"):
                return re.sub(rf"; rank {rank} stops too.*$", "", word["failed"])
        for rank, word in words.items():
            if not word.get("done"):
                where = f" (pid {word['pid']} on {word['host']})" if word.get("pid") else ""
                return f"rank {rank}{where} ended without a word while {word['doing']}"
        return None

    def failed(self, line: str) -> None:
        """This process stops with an error (the first it reports): from now on its beats carry
        it, so that the others name it at once instead of waiting for its silence (or for
        torchrun's grace period)."""
        if not self.failure:
            self.failure = {"failed": line, "failed_while": self.activity.describe()}
            self.activity.changed.set()  # told now, not at the next beat

    def stalled(self) -> Optional[str]:
        """The line for the first peer silent for `timeout` seconds, or None."""
        found = self._silent()
        return None if found is None else self._stall_line(*found)

    def _stall_line(self, rank: int, peer: Peer) -> str:
        return (f"rank {rank}{peer.where()} stopped answering {time.monotonic() - peer.heard:.0f} s ago while {peer.doing}; "
                f"rank {self.rank} stops too instead of waiting for it (train.stall_timeout={self.timeout:g} s)")

    def _silent(self) -> Optional[Tuple[int, Peer]]:
        """The first peer (its rank, and it) silent for `timeout` seconds that has not ended."""
        now = time.monotonic()
        return next(((rank, p) for rank, p in self.peers.items() if now - p.heard >= self.timeout and not p.done), None)

    def explain(self) -> Optional[str]:
        """After a collective failed: the line for a peer that stopped with an error (its beats
        said so), that died (on this host: its process is gone), or that stalled, waiting at
        most `timeout` seconds for a silence to show."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self._listen()  # what the others said last, their process ids among it
            except Exception:  # the store's server is gone: what was heard stands
                pass
            for rank, peer in self.peers.items():
                if peer.failed:
                    return (f"rank {rank}{peer.where()} failed while {peer.failed_while}: {peer.failed}; rank {self.rank} "
                            f"stops too ({_what_follows()})")
                if peer.pid and not peer.done and peer.host == socket.gethostname() and not _alive(peer.pid):
                    return (f"rank {rank} (pid {peer.pid} on {peer.host}) died while {peer.doing}; rank {self.rank} "
                            f"stops too ({_what_follows()})")
            line = self.stalled()
            if line is not None or time.monotonic() > deadline:
                return line
            time.sleep(0.2)

    def _run(self) -> None:
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        listened = 0.0
        while not self.stop.is_set():
            self.activity.changed.clear()
            try:
                self.beat += 1
                self.store.set(str(self.rank), json.dumps({"beat": self.beat, "doing": self.activity.describe(), **me,
                                                           **self.failure}))
                if time.monotonic() - listened >= self.interval:
                    self._listen()
                    listened = time.monotonic()
            except Exception:  # the store's server (torchrun's agent, or rank 0) is gone: no one is heard
                pass
            found = self._silent()
            if found is not None and not self.stop.is_set():
                self._end(self._stall_line(*found), found[1])
            self.activity.changed.wait(self.interval)  # a beat a second, and one at each change of phase

    def _listen(self) -> None:
        """Read the others' beats; a counter that moved is a peer heard now."""
        for rank, peer in self.peers.items():
            if not self.store.check([str(rank)]):
                continue
            heard = json.loads(self.store.get(str(rank)))
            if heard["beat"] != peer.beat:
                peer.beat, peer.heard, peer.doing = heard["beat"], time.monotonic(), heard["doing"]
                peer.pid, peer.host, peer.done = heard.get("pid", peer.pid), heard.get("host", peer.host), "done" in heard
                peer.failed, peer.failed_while = heard.get("failed", ""), heard.get("failed_while", "")

    def _end(self, line: str, stalled: Optional[Peer] = None) -> None:
        """One line, then the end of this process: its main thread may never come back. A stalled
        process of this host is ended too (SIGKILL: a stopped process takes no other signal),
        as torchrun would after its grace period: the job ends now, not 30 s later."""
        print(f"translate train: error: {line}", file=sys.stderr, flush=True)
        self.failure = {"failed": line, "failed_while": self.activity.describe()}
        self._last_word()  # for the others, and for a restarted attempt
        if stalled is not None and stalled.pid and stalled.host == socket.gethostname() and _alive(stalled.pid):
            try:
                os.kill(stalled.pid, signal.SIGKILL)
            except OSError:  # gone meanwhile, or not ours to end
                pass
        os._exit(STALLED_EXIT)


def _alive(pid: int) -> bool:
    """Whether a process of this host runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _what_follows() -> str:
    """What a stop of the job leads to: torchrun's restart while it has restarts left
    (--max-restarts), else the user's own command."""
    left = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) - int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    return "torchrun restarts the job from its last checkpoint" if left > 0 else "resume with the same command"
