"""The learning-rate schedule and the label-smoothed loss, against hand computation."""

import math

import pytest
import torch
import torch.nn.functional as F

from translate.config import OptimConfig
from translate.training.loss import label_smoothed_nll
from translate.training.optim import build_optimizer
from translate.training.schedule import InverseSquareRootSchedule


def noam(step: int, d_model: int = 512, warmup: int = 4000, scale: float = 1.0) -> float:
    """The paper's formula (section 5.3), written out again as the reference."""
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@pytest.mark.parametrize("step", [1, 4000, 8000])
def test_rate_equals_the_formula(step):
    assert InverseSquareRootSchedule(512, 4000).rate_at(step) == noam(step)


def test_rate_values_by_hand():
    schedule = InverseSquareRootSchedule(512, 4000)
    assert schedule.rate_at(1) == pytest.approx(1 / math.sqrt(512) / 4000**1.5)
    assert schedule.rate_at(4000) == pytest.approx(1 / math.sqrt(512) / math.sqrt(4000))  # the peak
    assert schedule.rate_at(8000) == pytest.approx(1 / math.sqrt(512) / math.sqrt(8000))
    assert InverseSquareRootSchedule(512, 4000, lr_scale=2.0).rate_at(4000) == pytest.approx(2 / math.sqrt(512) / math.sqrt(4000))


def test_the_device_rate_of_every_update_is_the_formula_exactly():
    schedule = InverseSquareRootSchedule(512, 10, updates=30)
    for update in range(1, 35):  # past the table: its last rate
        assert schedule.rate().item() == noam(min(update, 31), 512, 10)
        schedule.step()


def test_taking_a_step_back_restores_the_exact_rate():
    schedule = InverseSquareRootSchedule(256, 7, updates=20)
    rates = []
    for _ in range(9):
        rates.append(schedule.rate().item())
        schedule.step()
    for expected in reversed(rates):
        schedule.step_back()
        assert schedule.rate().item() == expected
    schedule.step_back(torch.tensor(False))  # a device flag that is not set takes nothing back
    assert schedule.rate().item() == rates[0]


def test_a_dropped_update_leaves_the_schedule_where_it_was():
    schedule = InverseSquareRootSchedule(512, 10, updates=20)
    schedule.step()
    before = schedule.rate().item()
    schedule.step(dropped=torch.tensor(True))  # flagged on the device: not counted
    assert schedule.rate().item() == before and schedule.state_dict()["applied"] == 1
    schedule.step(dropped=torch.tensor(False))
    assert schedule.rate().item() == noam(3, 512, 10)


def test_schedule_state_round_trip_and_the_old_lambdalr_state():
    schedule = InverseSquareRootSchedule(512, 10, updates=20)
    for _ in range(5):
        schedule.step()
    restored = InverseSquareRootSchedule(512, 10, updates=20)
    restored.load_state_dict(schedule.state_dict())
    assert restored.rate().item() == schedule.rate().item() == noam(6, 512, 10)
    # Checkpoints written before the schedule class held a LambdaLR's state: its last_epoch
    # counted the updates applied.
    optimizer = torch.optim.Adam(torch.nn.Linear(2, 2).parameters(), lr=1.0)
    lambda_lr = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: noam(done + 1, 512, 10))
    for _ in range(5):
        optimizer.step()
        lambda_lr.step()
    old = InverseSquareRootSchedule(512, 10, updates=20)
    old.load_state_dict(lambda_lr.state_dict())
    assert old.rate().item() == optimizer.param_groups[0]["lr"]


def test_optimizer_follows_the_schedule_update_by_update():
    """Adam's step at the schedule's rate equals torch's Adam given that rate by hand."""
    torch.manual_seed(0)
    model, reference = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    reference.load_state_dict(model.state_dict())
    optimizer, schedule = build_optimizer(model, OptimConfig(warmup_steps=10), d_model=512, updates=30)
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_label_smoothed_gradient_matches_torch(dtype):
    """The written-out gradient (softmax - q, times the upstream gradient) equals autograd's of
    F.cross_entropy, on a slice of wider logits as the model's padded vocabulary gives."""
    torch.manual_seed(0)
    wide = torch.randn(64, 48, dtype=dtype) * 3
    target = torch.randint(0, 40, (64,))
    ours, theirs = wide.clone().requires_grad_(), wide.clone().requires_grad_()
    loss, nll = label_smoothed_nll(ours[:, :40], target, 0.1)
    (loss * 0.37).backward()
    expected = F.cross_entropy(theirs[:, :40].float(), target, label_smoothing=0.1, reduction="sum")
    (expected * 0.37).backward()
    assert not nll.requires_grad
    assert ours.grad.dtype == dtype and ours.grad[:, 40:].abs().max() == 0
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(ours.grad.float(), theirs.grad.float(), **tolerance)


def test_label_smoothed_graph_runs_backward_once():
    logits = torch.randn(4, 7, requires_grad=True)
    loss, _ = label_smoothed_nll(logits, torch.tensor([0, 1, 2, 3]), 0.1)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward twice"):
        loss.backward()
