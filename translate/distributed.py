"""Processes under torchrun: who this process is, its device, and the collectives training needs.

PyTorch's own engine: torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; the process group is
NCCL on GPUs and gloo on CPUs. A single process needs no process group at all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import List

import torch
import torch.distributed as dist


@dataclass
class Context:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        """Only the main process logs, writes checkpoints and TensorBoard."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init(timeout_minutes: float = 30.0) -> Context:
    """Join the process group torchrun describes (if any) and pick this process's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=timeout_minutes))
    rank = dist.get_rank() if dist.is_initialized() else 0
    return Context(rank, world_size, local_rank, device)


def all_sum(values: List[float], context: Context) -> List[float]:
    """Element-wise sum over all processes (identity for one process)."""
    if not context.distributed:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=context.device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def any_true(flag: bool, context: Context) -> bool:
    """True on every process if it is true on any (e.g. a stop decision all must share)."""
    return all_sum([float(flag)], context)[0] > 0


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
