"""The optimizer (translate.training.optim): the paper's Adam, stepping at the schedule's rate."""

import pytest
import torch

from tests.conftest import noam
from translate.core.config import OptimConfig
from translate.training.optim import build_optimizer


def test_optimizer_follows_the_schedule_update_by_update():
    """Adam's step at the schedule's rate equals torch's Adam given that rate by hand."""
    torch.manual_seed(0)
    model, reference = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    reference.load_state_dict(model.state_dict())
    optimizer, schedule = build_optimizer(model, OptimConfig(warmup_steps=10), d_model=512, last_update=30)
    assert optimizer.defaults["betas"] == (0.9, 0.98) and optimizer.defaults["eps"] == 1e-9
    plain = torch.optim.Adam(reference.parameters(), betas=(0.9, 0.98), eps=1e-9, fused=True)
    for update in range(1, 25):
        x = torch.randn(3, 4)
        for net in (model, reference):
            net(x).square().sum().backward()
        assert schedule.rate().item() == noam(update, 512, 10)
        plain.param_groups[0]["lr"] = noam(update, 512, 10)
        optimizer.update(schedule.rate(), torch.tensor(False))
        schedule.step()
        plain.step()
        for net, opt in ((model, optimizer), (reference, plain)):
            opt.zero_grad()
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))


def test_optim_warmup_ratio_reaches_the_schedule():
    """optim.warmup_ratio and optim.decay from the configuration: 30 updates at ratio 0.2 end a
    10-update warmup at update 6, and decay linearly from the rate reached there."""
    from translate.core.choices import Decay

    _, schedule = build_optimizer(torch.nn.Linear(2, 2), OptimConfig(warmup_steps=10, warmup_ratio=0.2, decay=Decay.linear),
                                  d_model=512, last_update=30)
    assert schedule.warmup == 6 and schedule.rate_at(6) == noam(6, 512, 10)
    assert schedule.rate_at(7) == noam(6, 512, 10) * 24 / 25  # (30 + 1 - 7) / (30 + 1 - 6)


def test_optim_cut_peak_power_reaches_the_schedule_and_is_checked():
    """optim.cut_peak_power 0 from the configuration: the warmup cut at update 6 of 30 ends at the
    full peak of a 10-update warmup; outside [0, 1], or without a warmup_ratio, one clear error."""
    _, schedule = build_optimizer(torch.nn.Linear(2, 2), OptimConfig(warmup_steps=10, warmup_ratio=0.2, cut_peak_power=0.0),
                                  d_model=512, last_update=30)
    assert schedule.warmup == 6 and schedule.rate_at(6) == pytest.approx(noam(10, 512, 10))
    with pytest.raises(ValueError, match=r"optim.cut_peak_power \(1.5\) must be in \[0, 1\]"):
        OptimConfig(warmup_ratio=0.2, cut_peak_power=1.5)
    with pytest.raises(ValueError, match="optim.warmup_ratio, which is null"):
        OptimConfig(cut_peak_power=0.5)
