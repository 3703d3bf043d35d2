"""Adam (paper, section 5.3) whose update can be dropped on the device, with the paper's schedule."""

from __future__ import annotations

from typing import List, Tuple

import torch
from torch import Tensor, nn
from torch.optim.adam import adam

from translate.core.config import OptimConfig
from translate.training.schedule import LearningRateSchedule


class Adam(torch.optim.Adam):
    """torch's Adam (its fused kernel where the device has one, else foreach), stepped by
    `update(lr, dropped)`: the learning rate is a device scalar from the schedule, and a
    dropped update (a device flag) leaves weights, moments and step counts as they were,
    without the host reading anything. State and state_dict are torch's own."""

    @torch.no_grad()
    def update(self, lr: Tensor, dropped: Tensor) -> None:
        """One step of every parameter with a gradient. lr: () the rate; dropped: () bool."""
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            states = [self._state(p, group["fused"]) for p in params]
            beta1, beta2 = group["betas"]
            tensors = ([p.grad for p in params], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states])
            steps: List[Tensor] = [s["step"] for s in states]
            options = dict(amsgrad=False, beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"],
                           eps=group["eps"], maximize=False)
            if group["fused"]:  # found_inf: the kernel skips the update, and the step count
                adam(params, *tensors, [], steps, fused=True, found_inf=dropped.float(), lr=lr, **options)
            elif not bool(dropped):  # the other implementations take no found_inf: the host must look
                adam(params, *tensors, [], steps, foreach=group["foreach"], lr=float(lr), **options)

    def _state(self, parameter: Tensor, fused: bool) -> dict:
        """A parameter's Adam state, created as torch's Adam creates it (the step count on the
        parameter's device for the fused kernel, on the host otherwise)."""
        state = self.state[parameter]
        if not state:
            device = parameter.device if fused else torch.device("cpu")
            state["step"] = torch.zeros((), dtype=torch.float32, device=device)
            state["exp_avg"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
        return state


def build_optimizer(
    model: nn.Module, cfg: OptimConfig, *, d_model: int, last_update: int, device: torch.device = torch.device("cpu")
) -> Tuple[Adam, LearningRateSchedule]:
    """Adam(beta1, beta2, eps) and the schedule that gives its rate for each update up to `last_update`."""
    beta1, beta2 = cfg.betas
    # lr: unused, the schedule gives every update's rate. Fused (one pass over all parameters)
    # where the device has the kernel, else foreach.
    try:
        optimizer = Adam(model.parameters(), lr=0.0, betas=(beta1, beta2), eps=cfg.eps, fused=True)
    except (RuntimeError, TypeError):
        optimizer = Adam(model.parameters(), lr=0.0, betas=(beta1, beta2), eps=cfg.eps, foreach=True)
    schedule = LearningRateSchedule(d_model, cfg.warmup_steps, lr_scale=cfg.lr_scale, last_update=last_update,
                                    device=device, decay=cfg.decay, warmup_ratio=cfg.warmup_ratio,
                                    cut_peak_power=cfg.cut_peak_power)
    return optimizer, schedule
