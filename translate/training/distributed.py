"""Processes under torchrun or submitit: who this process is, its device, and the collectives
training needs.

PyTorch's own engine: torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; the process group is
NCCL on GPUs and gloo on CPUs. A single process needs no process group at all. Under Hydra's
submitit launcher (SLURM, or submitit_local) there is no torchrun: every task of the job runs
the same command, and who is who comes from submitit's JobEnvironment (SLURM's variables).
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import zlib
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass
class Activity:
    """What this process is doing (a phase of the loop, cheap to set at each), for the watchdog,
    which tells the other processes: they name it if this process stalls."""

    what: str = "starting"
    changed: threading.Event = field(default_factory=threading.Event)  # the watchdog's thread waits on it
    writing: str = ""  # a checkpoint being written in the background (CheckpointWriter), if any

    def doing(self, what: str) -> None:
        self.what = what
        self.changed.set()  # the watchdog's thread tells the others now, not at its next beat

    def describe(self) -> str:
        """What the watchdog says this process was doing: the loop's phase, and a checkpoint
        being written beside it."""
        return f"{self.what} ({self.writing} being written in the background)" if self.writing else self.what


@dataclass
class Context:
    """This process in its job: who it is, its device, the groups its collectives go through, and
    what it is doing."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    job: int = 0  # process groups this process has joined, this job's included (a multirun sweep joins one per job)
    attempt: int = 0  # torchrun's restarts of the job before this one (--max-restarts)
    host_group: Any = field(default=None, repr=False, compare=False)  # gloo beside NCCL, for numbers the host holds
    activity: Activity = field(default_factory=Activity, repr=False, compare=False)

    @property
    def is_main(self) -> bool:
        """Only the main process logs, writes checkpoints and TensorBoard."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


@dataclass
class Launch:
    """Who this process is in a job that torchrun did not start, and where rank 0 listens."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


def submitit_launch(env) -> Launch:
    """Ranks and the rendezvous of a submitit task, from its JobEnvironment.

    Every task of a job sees the same job id and node list, so all agree on the address (the
    first node; the loopback on a single node) and on the port (derived from the job id, so
    that jobs sharing a node differ; 20000-31999: below Linux's ephemeral ports, from 32768).
    MASTER_ADDR and MASTER_PORT, where set, win.
    """
    job_id = str(env.raw_job_id)
    number = int(job_id) if job_id.isdigit() else zlib.crc32(job_id.encode())
    addr = "127.0.0.1" if env.num_nodes == 1 else env.hostnames[0]
    return Launch(env.global_rank, env.num_tasks, env.local_rank, addr, 20000 + number % 12000)


def _submitit_launch() -> Optional[Launch]:
    """A Launch when this process is a submitit task (checked without importing submitit
    elsewhere), else None."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    import submitit

    try:
        env = submitit.JobEnvironment()
    except RuntimeError:  # not inside a job after all
        return None
    return submitit_launch(env)


def init(timeout_minutes: float = 30.0) -> Context:
    """Join the process group torchrun or submitit describes (if any) and pick this process's device."""
    timeout = timedelta(minutes=timeout_minutes)
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    launch = None if "RANK" in os.environ and "WORLD_SIZE" in os.environ else _submitit_launch()
    if launch is not None:
        rank, world_size, local_rank = launch.rank, launch.world_size, launch.local_rank
        # One task per GPU; where SLURM shows each task only its own GPU(s), the index wraps.
        gpu = local_rank % torch.cuda.device_count() if cuda else 0
        if world_size > 1:  # where the process group meets (env://); set ones win
            os.environ.setdefault("MASTER_ADDR", launch.master_addr)
            os.environ.setdefault("MASTER_PORT", str(launch.master_port))
    else:  # torchrun's variables, or a single process
        rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        local_rank = gpu = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", gpu) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    host_group = None
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if world_size > 1 and not dist.is_initialized():
        _init_process_group(backend, timeout, rank, world_size, _store_prefix(attempt, _PROCESS.groups_joined))
        _PROCESS.groups_joined += 1
        # Host numbers (token counts, stop flags) go through gloo: summed through NCCL they
        # would have to be copied to the GPU and back, and the host would wait for its queue.
        host_group = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else None
    rank = dist.get_rank() if dist.is_initialized() else rank
    return Context(rank, world_size, local_rank, device, job=_PROCESS.groups_joined, attempt=attempt,
                   host_group=host_group)


@dataclass
class _Process:
    """What this process keeps from one job to the next (each job has a Context of its own)."""

    groups_joined: int = 0  # process groups: one per job of a multirun sweep


_PROCESS = _Process()


def _store_prefix(attempt: int, before: int) -> str:
    """Where the process group's rendezvous keys go in the job's store: `attempt`, torchrun's
    restarts before this one; `before`, the groups this process joined before this one.

    The first group of the first attempt as PyTorch makes it (no prefix). Any other gets a
    prefix of its own, since torchrun's store outlives the group and PyTorch names each group
    as it named the previous one: a later job of a multirun sweep (in the same processes), or
    the group of a restarted attempt (new processes, the same agent's store), would read the
    previous group's keys: the addresses of processes that are gone (gloo: "connectFullMesh
    failed ... Connection refused"), or a hang.
    """
    return "" if attempt == 0 and before == 0 else f"translate-{attempt}-{before}/"


def _init_process_group(backend: str, timeout: timedelta, rank: int, world_size: int, prefix: str) -> None:
    """The default process group, from MASTER_ADDR/MASTER_PORT (env://), its keys under
    `prefix` in the store (see _store_prefix)."""
    if not prefix:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size, timeout=timeout)
    else:
        store, rank, world_size = next(dist.rendezvous("env://", rank=rank, world_size=world_size, timeout=timeout))
        store = dist.PrefixStore(prefix, store)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


# The host tensors handed to the collectives below, held here until the process group is left.
# gloo's worker threads drop their own references to a collective's tensors after it has ended;
# were theirs the last, they would need the GIL to free a tensor Python made, and the group's
# destructor holds the GIL while it waits for those threads (it runs where the last reference
# to the group goes: DistributedDataParallel's reducer, freed as a sweep's job ends): under load
# the two would wait for each other for ever (py-spy: ~ProcessGroupGloo in std::thread::join,
# a worker in ~AsyncAllreduceWork waiting for the GIL). Held here, Python always frees them.
_held: List[torch.Tensor] = []


_HOLD = 64  # tensors held: a worker thread has long freed those of older collectives (it frees each before its next)


def _hold(*tensors: torch.Tensor) -> None:
    _held.extend(tensors)
    del _held[:-_HOLD]


def all_sum(values: List[float], context: Context) -> List[float]:
    """Element-wise sum over all processes (identity for one process)."""
    if not context.distributed:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64)  # on the host: gloo (a second group beside NCCL)
    _hold(tensor)
    dist.all_reduce(tensor, group=context.host_group)
    return tensor.tolist()


def from_main(value: Any, context: Context) -> Any:
    """The main process's value (a small picklable object) on every process."""
    if not context.distributed:
        return value
    payload = pickle.dumps(value) if context.is_main else b""
    size = torch.tensor([len(payload)], dtype=torch.int64)
    _hold(size)
    dist.broadcast(size, src=0, group=context.host_group)
    data = torch.tensor(list(payload), dtype=torch.uint8) if context.is_main else torch.empty(int(size), dtype=torch.uint8)
    _hold(data)
    dist.broadcast(data, src=0, group=context.host_group)
    return pickle.loads(data.numpy().tobytes())


def gather_objects(value: Any, context: Context) -> List[Any]:
    """Every process's value (picklable), in rank order, on every process."""
    if not context.distributed:
        return [value]
    payload = pickle.dumps(value)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(context.world_size)]
    size = torch.tensor([len(payload)], dtype=torch.int64)
    _hold(size, *sizes)
    dist.all_gather(sizes, size, group=context.host_group)
    longest = int(max(s.item() for s in sizes))
    data = torch.zeros(longest, dtype=torch.uint8)
    data[: len(payload)] = torch.tensor(list(payload), dtype=torch.uint8)
    gathered = [torch.empty(longest, dtype=torch.uint8) for _ in range(context.world_size)]
    _hold(data, *gathered)
    dist.all_gather(gathered, data, group=context.host_group)
    return [pickle.loads(g[: int(s.item())].numpy().tobytes()) for g, s in zip(gathered, sizes)]


def shutdown(context: Context, seconds: float = 60.0) -> None:
    """Leave the process group, waiting at most `seconds`: a peer that has gone may leave the
    destruction waiting on it, and the process must still end."""
    context.host_group = None
    if dist.is_initialized():
        within(seconds, "leaving the process group", dist.destroy_process_group)
    _held.clear()  # the group's threads are gone (or left behind): these are Python's alone


def within(seconds: float, what: str, action: Callable[[], None]) -> bool:
    """Run `action` in a thread of its own for at most `seconds`; past that, say so and go on
    (the thread, a daemon, does not keep the process from ending). Returns whether it ended."""
    thread = threading.Thread(target=action, name=f"translate-{what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        log.warning(f"{what} did not end within {seconds:g} s: going on without it")
        return False
    return True
