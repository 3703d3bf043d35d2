"""One update of training: forward and backward over its micro-batches (train_step), the
optimizer step (apply_update), and its outcome on its way to the host (QueuedUpdate), so
that the loop in translate.training.trainer never makes the host wait for the device within an update.

Knows nothing of Hydra or files: the GPU benchmark drives these directly.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

import torch
from torch import nn

from translate.training import distributed
from translate.data.batching import Batch
from translate.training.optim import Adam
from translate.training.schedule import LearningRateSchedule


class QueuedUpdate:
    """One queued update's outcome on its way to the host: its gradient norm, loss sums and
    learning rate are copied into pinned memory right behind the update's own work, with an
    event that waits for that copy alone. (A plain .item() would also wait for every update
    queued after it.)"""

    def __init__(self, stats: "StepStats", grad_norm: torch.Tensor, lr: torch.Tensor):
        self.stats = stats
        values = torch.stack([v.reshape(()).double() for v in (grad_norm, stats.loss, stats.nll, lr)])  # (4,)
        if values.is_cuda:
            self.host = torch.empty(4, dtype=torch.float64, pin_memory=True)
            self.host.copy_(values, non_blocking=True)
            self.ready: Optional[torch.cuda.Event] = torch.cuda.Event()
            self.ready.record()
        else:
            self.host, self.ready = values, None

    def read(self) -> Tuple[float, float, float, float]:
        """(gradient norm, loss sum, NLL sum, learning rate); waits for the device up to this
        update only."""
        if self.ready is not None:
            self.ready.synchronize()
        norm, loss, nll, lr = self.host.tolist()
        return norm, loss, nll, lr


@dataclass
class StepStats:
    """Sums over the micro-batches of one update."""

    # Label-smoothed loss and NLL, summed over target tokens: device tensors until the loop
    # reads them (QueuedUpdate), so that an update never makes the host wait for the device.
    loss: Union[float, torch.Tensor] = 0.0
    nll: Union[float, torch.Tensor] = 0.0
    target_tokens: int = 0
    padded_tokens: int = 0  # source + target positions, padding included
    real_tokens: int = 0  # source + target positions without padding

    def add(self, other: "StepStats") -> None:
        for name in ("loss", "nll", "target_tokens", "padded_tokens", "real_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def summed(self, context: distributed.Context) -> "StepStats":
        """These sums over all processes."""
        names = ("loss", "nll", "target_tokens", "padded_tokens", "real_tokens")
        values = distributed.all_sum([float(getattr(self, n)) for n in names], context)
        return StepStats(*values[:2], *(int(v) for v in values[2:]))

    @property
    def padding(self) -> float:
        """Share of padded positions among all source and target positions."""
        return 1 - self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0


def batch_plan(tokens_per_update: int, tokens_per_batch: int, world_size: int = 1) -> Tuple[int, int]:
    """(tokens per micro-batch, micro-batches per process per update), so that an update holds
    about tokens_per_update tokens whatever the number of processes: the per-process batch
    shrinks to tokens_per_update / world_size where tokens_per_batch is larger (the paper's
    25k-token update on 8 GPUs: 3,125 each), and batches accumulate where it is smaller."""
    per_batch = min(tokens_per_batch, math.ceil(tokens_per_update / world_size))
    return per_batch, max(1, math.ceil(tokens_per_update / (per_batch * world_size)))


def train_step(
    objective: nn.Module,
    batches: List[Batch],
    context: distributed.Context = distributed.Context(),
    autocast: Optional[torch.autocast] = None,
    scaler: Optional["torch.amp.GradScaler"] = None,
) -> StepStats:
    """Forward and backward over this process's micro-batches of one update.

    objective: (src, tgt_in, select, target) -> summed loss and NLL, a LabelSmoothedObjective,
    maybe compiled and wrapped in DistributedDataParallel.

    The gradients end up as those of the loss summed over every target token of the update,
    on all processes, divided by their number: as one large batch on one process, whatever
    the split. Only the last micro-batch all-reduces gradients (DistributedDataParallel).
    """
    local_tokens = sum(b.target_tokens for b in batches)
    global_tokens = distributed.all_sum([local_tokens], context)[0]
    # DDP averages gradients over processes; multiplying by world_size turns that into the sum.
    scale = context.world_size / global_tokens
    stats = StepStats(target_tokens=local_tokens)
    sums = []  # (2,) loss and NLL per micro-batch
    for i, batch in enumerate(batches):
        stats.padded_tokens += batch.padded_tokens
        stats.real_tokens += batch.real_tokens
        inputs = batch.objective_inputs(context.device)  # src, tgt_in, select, target
        last = i == len(batches) - 1
        sync = contextlib.nullcontext() if last or not hasattr(objective, "no_sync") else objective.no_sync()
        with sync:
            with autocast or contextlib.nullcontext():
                loss, nll = objective(*inputs)  # logits at real positions only
            scaled = loss * scale
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        sums.append(torch.stack([loss.detach(), nll.detach()]))
    stats.loss, stats.nll = torch.stack(sums).sum(0).unbind()  # still on the device: not read here
    return stats


def apply_update(
    model: nn.Module, optimizer: Adam, schedule: LearningRateSchedule,
    scaler: Optional["torch.amp.GradScaler"], clip_norm: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The optimizer step after train_step: unscale (fp16), clip, Adam at the schedule's rate,
    advance the schedule, all without making the host wait for the device (on a GPU each wait
    idles it while the host then queues the next update).

    Returns the gradient norm and the rate used, device scalars for the loop to read later
    (QueuedUpdate). Where the norm is not finite (a non-finite loss gives non-finite
    gradients, and finite ones can still overflow the norm), the update is dropped on the
    device: weights, moments, Adam's step count and the schedule stay as they were; fp16's
    loss scale backs off. The gradients are all-reduced, so every process drops alike."""
    if scaler is not None:
        scaler.unscale_(optimizer)  # also records, for scaler.update(), whether gradients overflowed
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), clip_norm if clip_norm > 0 else math.inf)
    dropped = ~torch.isfinite(grad_norm)  # () bool, on the device
    lr = schedule.rate()
    optimizer.update(lr, dropped)
    if scaler is not None:
        scaler.update()
    schedule.step(dropped)
    optimizer.zero_grad(set_to_none=True)
    return grad_norm.detach(), lr
