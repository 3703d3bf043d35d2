"""The learning-rate schedule and the label-smoothed loss, against hand computation."""

import math

import pytest
import torch
import torch.nn.functional as F

from translate.config import OptimConfig
from translate.loss import label_smoothed_nll
from translate.optim import build_optimizer, noam_lr


@pytest.mark.parametrize("step", [1, 4000, 8000])
def test_noam_lr_equals_the_formula(step):
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    assert noam_lr(step, 512, 4000) == pytest.approx(expected, rel=1e-12)


def test_noam_lr_values_by_hand():
    assert noam_lr(1, 512, 4000) == pytest.approx(1 / math.sqrt(512) / 4000**1.5)
    assert noam_lr(4000, 512, 4000) == pytest.approx(1 / math.sqrt(512) / math.sqrt(4000))  # the peak
    assert noam_lr(8000, 512, 4000) == pytest.approx(1 / math.sqrt(512) / math.sqrt(8000))
    assert noam_lr(4000, 512, 4000, lr_scale=2.0) == pytest.approx(2 / math.sqrt(512) / math.sqrt(4000))


def test_optimizer_follows_the_schedule_update_by_update():
    model = torch.nn.Linear(4, 4)
    optimizer, scheduler = build_optimizer(model, OptimConfig(warmup_steps=10), d_model=512)
    assert optimizer.defaults["betas"] == (0.9, 0.98) and optimizer.defaults["eps"] == 1e-9
    for update in range(1, 25):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(noam_lr(update, 512, 10))
        optimizer.step()
        scheduler.step()


def test_label_smoothed_loss_by_hand():
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.0, 1.0, 3.0]])
    target = torch.tensor([0, 1])
    eps = 0.1
    loss, nll = label_smoothed_nll(logits, target, eps)
    expected_loss = expected_nll = 0.0
    for row, gold in zip(logits.tolist(), target.tolist()):
        log_z = math.log(sum(math.exp(v) for v in row))
        log_p = [v - log_z for v in row]
        q = [(1 - eps) * (i == gold) + eps / 3 for i in range(3)]  # smoothed target distribution
        expected_loss += -sum(qi * lp for qi, lp in zip(q, log_p))
        expected_nll += -log_p[gold]
    assert loss.item() == pytest.approx(expected_loss, rel=1e-6)
    assert nll.item() == pytest.approx(expected_nll, rel=1e-6)


def test_label_smoothed_loss_matches_torch():
    torch.manual_seed(0)
    logits, target = torch.randn(50, 37), torch.randint(0, 37, (50,))
    loss, nll = label_smoothed_nll(logits, target, 0.1)
    assert loss.item() == pytest.approx(F.cross_entropy(logits, target, label_smoothing=0.1, reduction="sum").item(), rel=1e-5)
    assert nll.item() == pytest.approx(F.cross_entropy(logits, target, reduction="sum").item(), rel=1e-5)
