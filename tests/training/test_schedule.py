"""The learning-rate schedule (translate.training.schedule) against the paper's formula: each
update's rate on the device, a step back, a dropped update, and its state (the old one too)."""

import math

import pytest
import torch

from tests.conftest import noam
from translate.training.schedule import InverseSquareRootSchedule


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
