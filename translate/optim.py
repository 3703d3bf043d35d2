"""Adam with the paper's learning-rate schedule (section 5.3)."""

from __future__ import annotations

from typing import Tuple

import torch
from torch import nn

from translate.config import OptimConfig


def noam_lr(step: int, d_model: int, warmup_steps: int, lr_scale: float = 1.0) -> float:
    """lrate = lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5), step >= 1."""
    step = max(step, 1)
    return lr_scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def build_optimizer(
    model: nn.Module, cfg: OptimConfig, d_model: int
) -> Tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """Adam(beta1, beta2, eps) whose learning rate at update n (from 1) is noam_lr(n)."""
    beta1, beta2 = cfg.betas
    # The fused kernel (one pass over all parameters) where the device has one, else foreach.
    try:
        optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(beta1, beta2), eps=cfg.eps, fused=True)
    except (RuntimeError, TypeError):
        optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(beta1, beta2), eps=cfg.eps, foreach=True)
    # LambdaLR multiplies lr=1.0 by the lambda of the number of scheduler.step() calls so far:
    # before the first update that is 0, so the first update uses noam_lr(1).
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda done: noam_lr(done + 1, d_model, cfg.warmup_steps, cfg.lr_scale)
    )
    return optimizer, scheduler
