"""The update (translate.training.update): a training step on real data lowers the loss,
accumulation gives the gradient of one large batch, the batch plan keeps the update's size, and
a non-finite update is dropped on the device."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from tests.conftest import MULTI30K, SMALL, need
from translate.core.config import OptimConfig
from translate.data.batching import collate, token_batches
from translate.data.preparation import prepare
from translate.model import Transformer
from translate.training.loss import LabelSmoothedObjective
from translate.training.optim import build_optimizer
from translate.training.update import apply_update, batch_plan, train_step


@pytest.fixture
def small_data(compose):
    need(MULTI30K)
    cfg = compose("train", *SMALL)
    return cfg, prepare(cfg.data, log=lambda _: None)


def test_training_on_real_data_lowers_the_loss(small_data):
    cfg, data = small_data
    torch.manual_seed(0)
    model = Transformer(replace(cfg.model, vocab_size=len(data.vocabulary), dropout=0.0))
    optimizer, schedule = build_optimizer(model, replace(cfg.optim, warmup_steps=10), d_model=cfg.model.d_model,
                                          last_update=40)
    batches = token_batches(data.train.src_lengths, data.train.tgt_lengths, 1500, seed=1, epoch=0)
    held_out = collate(data.train, batches[0], data.vocabulary.specials)

    def held_out_loss():
        with torch.no_grad():
            model.eval()
            stats = train_step_no_grad(model, held_out)
            model.train()
            return stats

    before = held_out_loss()
    for indices in batches[1:41]:
        train_step(LabelSmoothedObjective(model, 0.1), [collate(data.train, indices, data.vocabulary.specials)])
        apply_update(model, optimizer, schedule, None, 0.0)
    after = held_out_loss()
    assert after < before - 1.0, (before, after)


def train_step_no_grad(model, batch):
    from translate.training.loss import label_smoothed_nll

    logits = model(batch.src, batch.tgt_in)
    real = batch.tgt_out != 0
    _, nll = label_smoothed_nll(logits[real], batch.tgt_out[real], 0.0)
    return nll.item() / batch.target_tokens


def test_accumulation_gives_the_gradient_of_one_large_batch(small_data):
    cfg, data = small_data
    torch.manual_seed(0)
    model = Transformer(replace(cfg.model, vocab_size=len(data.vocabulary), dropout=0.0))
    batches = token_batches(data.train.src_lengths, data.train.tgt_lengths, 600, seed=1, epoch=0)
    specials = data.vocabulary.specials
    parts = [collate(data.train, batches[0], specials), collate(data.train, batches[1], specials)]
    whole = collate(data.train, np.concatenate([batches[0], batches[1]]), specials)

    train_step(LabelSmoothedObjective(model, 0.1), parts)
    accumulated = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    train_step(LabelSmoothedObjective(model, 0.1), [whole])
    for a, b in zip(accumulated, (p.grad for p in model.parameters())):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_batch_plan_keeps_the_update_size():
    assert batch_plan(25000, 25000, 1) == (25000, 1)
    assert batch_plan(25000, 25000, 8) == (3125, 1)  # the paper's update on 8 GPUs, not 8 x 25k
    assert batch_plan(25000, 3125, 1) == (3125, 8)
    assert batch_plan(25000, 3125, 8) == (3125, 1)
    assert batch_plan(25000, 4096, 2) == (4096, 4)  # 32k: the nearest whole number of batches above
    assert batch_plan(4096, 4096) == (4096, 1)


def test_apply_update_steps_or_drops_a_non_finite_update_on_the_device():
    """A finite update steps the optimizer and the schedule; non-finite gradients (or finite
    ones whose norm overflows) leave the weights, Adam's moments and step count, and the
    schedule as they were (the fused kernel's found_inf, GradScaler, or the host check of
    other optimizers), and lower the fp16 loss scale."""
    from translate.training.optim import Adam
    from translate.training.schedule import LearningRateSchedule

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer, schedule = build_optimizer(model, OptimConfig(), d_model=4, last_update=10)
    assert optimizer.param_groups[0]["fused"]  # the device-side drop is what is tested first
    model(torch.ones(1, 3)).sum().backward()
    before = model.weight.detach().clone()
    first_rate = schedule.rate().item()
    norm, lr = apply_update(model, optimizer, schedule, None, 0.0)
    assert math.isfinite(float(norm)) and lr.item() == first_rate
    assert not torch.equal(model.weight, before) and schedule.state_dict()["applied"] == 1 and model.weight.grad is None

    def state():
        return [t.clone() for p in model.parameters() for t in (p.detach(), *optimizer.state[p].values())]

    def drop(scaler=None, gradient=float("nan")):
        rate, weights = schedule.rate().item(), state()
        loss = model(torch.ones(1, 3)).sum()
        (scaler.scale(loss) if scaler else loss).backward()
        model.weight.grad.fill_(gradient)
        norm, lr = apply_update(model, optimizer, schedule, scaler, 1.0)
        assert not math.isfinite(float(norm)) and lr.item() == rate
        assert all(torch.equal(a, b) for a, b in zip(state(), weights)) and model.weight.grad is None
        assert schedule.state_dict()["applied"] == 1 and schedule.rate().item() == rate  # where it was

    drop()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    drop(scaler)
    assert scaler.get_scale() < 1024.0  # the scale backs off on non-finite gradients
    drop(scaler, gradient=1e38)  # every gradient finite, their norm not: dropped as well
    optimizer = Adam(model.parameters(), lr=0.0, foreach=True)  # no found_inf: the host checks
    schedule = LearningRateSchedule(4, 4000, last_update=10)
    model(torch.ones(1, 3)).sum().backward()
    apply_update(model, optimizer, schedule, None, 0.0)  # one real step, so that Adam has state
    drop()


@pytest.mark.slow
def test_compiled_objective_equals_eager(small_data):
    """train.compile=true compiles the model and its loss as one graph: same loss and gradients."""
    cfg, data = small_data
    torch.manual_seed(0)
    model = Transformer(replace(cfg.model, vocab_size=len(data.vocabulary), dropout=0.0))
    batches = token_batches(data.train.src_lengths, data.train.tgt_lengths, 600, seed=1, epoch=0)
    compiled = torch.compile(LabelSmoothedObjective(model, 0.1), dynamic=True)
    for indices in batches[:2]:  # two shapes: the second runs the same dynamic-shape graph
        batch = collate(data.train, indices, data.vocabulary.specials)
        results = []
        for objective in (LabelSmoothedObjective(model, 0.1), compiled):
            model.zero_grad()
            stats = train_step(objective, [batch])
            results.append((float(stats.loss), [p.grad.clone() for p in model.parameters()]))
        (eager_loss, eager_grads), (compiled_loss, compiled_grads) = results
        assert compiled_loss == pytest.approx(eager_loss, rel=1e-5)
        for a, b in zip(eager_grads, compiled_grads):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
