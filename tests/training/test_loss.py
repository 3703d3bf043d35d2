"""The label-smoothed loss (translate.training.loss) against hand computation and torch's own:
its value, its written-out gradient, and its graph."""

import math

import pytest
import torch
import torch.nn.functional as F

from translate.training.loss import label_smoothed_nll


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


def test_chunked_bf16_loss_and_gradient_match_torch_across_chunks(monkeypatch):
    """On the CPU, 16-bit logits are scored and differentiated a few rows at a time: chunks of
    3 rows over 10 (the last one short) give torch's loss, NLL and gradient."""
    import translate.training.loss as loss_module

    monkeypatch.setattr(loss_module, "CHUNK_BYTES", 3 * 4 * 23)  # 3 fp32 rows of 23
    torch.manual_seed(1)
    logits = (torch.randn(10, 23) * 4).to(torch.bfloat16)
    target = torch.randint(0, 23, (10,))
    ours, theirs = logits.clone().requires_grad_(), logits.float().requires_grad_()
    loss, nll = label_smoothed_nll(ours, target, 0.2)
    (loss * 0.05).backward()
    expected = F.cross_entropy(theirs, target, label_smoothing=0.2, reduction="sum")
    (expected * 0.05).backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll, F.cross_entropy(theirs.detach(), target, reduction="sum"), rtol=1e-5, atol=1e-5)
    assert ours.grad.dtype == torch.bfloat16
    torch.testing.assert_close(ours.grad.float(), theirs.grad, rtol=1e-2, atol=1e-4)


def test_without_a_gradient_to_come_none_is_written_out(monkeypatch):
    """Validation (no_grad) scores 16-bit logits as torch does, without computing their gradient."""
    import translate.training.loss as loss_module

    def refused(*args):
        raise AssertionError("a gradient computed under no_grad")

    monkeypatch.setattr(loss_module, "_chunked_gradient", refused)
    torch.manual_seed(2)
    logits, target = (torch.randn(12, 29) * 3).to(torch.bfloat16).requires_grad_(), torch.randint(0, 29, (12,))
    with torch.no_grad():
        loss, nll = label_smoothed_nll(logits, target, 0.1)
    expected = F.cross_entropy(logits.detach().float(), target, label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll, F.cross_entropy(logits.detach().float(), target, reduction="sum"), rtol=1e-5, atol=1e-5)
    with pytest.raises(AssertionError, match="under no_grad"):  # with a gradient to come, it is written out
        label_smoothed_nll(logits, target, 0.1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_label_smoothed_graph_runs_backward_once(dtype):
    logits = torch.randn(4, 7, dtype=dtype, requires_grad=True)
    loss, _ = label_smoothed_nll(logits, torch.tensor([0, 1, 2, 3]), 0.1)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward twice"):
        loss.backward()


def test_the_vocabulary_projection_sees_rounded_row_counts():
    """LabelSmoothedObjective rounds the rows it projects up to ROW_MULTIPLE (so that CPU bf16's
    compiled products repeat their shapes), and the loss and gradients stay those of the real rows."""
    from translate.core.config import ModelConfig
    from translate.model import Transformer
    from translate.training.loss import LabelSmoothedObjective, ROW_MULTIPLE

    torch.manual_seed(0)
    model = Transformer(ModelConfig(layers=1, d_model=32, d_ff=64, heads=2, vocab_size=100, dropout=0.0))
    src, tgt = torch.randint(4, 100, (5, 7)), torch.randint(4, 100, (5, 9))
    select = torch.arange(0, 45, 2)  # 23 real positions
    target = tgt.flatten()[select]
    seen = []
    logits = model.logits
    model.logits = lambda hidden: seen.append(hidden.shape[0]) or logits(hidden)  # fp32: the plain path
    loss, nll = LabelSmoothedObjective(model, 0.1)(src, tgt, select, target)
    del model.logits
    assert seen == [ROW_MULTIPLE]
    loss.backward()
    padded_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    reference, reference_nll = label_smoothed_nll(model(src, tgt, select), target, 0.1)
    reference.backward()
    assert torch.allclose(loss, reference) and torch.allclose(nll, reference_nll)
    for got, want in zip(padded_grads, (p.grad for p in model.parameters())):
        assert torch.allclose(got, want, atol=1e-7)


def projected(fused: bool, hidden, weight, target, eps, monkeypatch):
    """Loss, NLL and the gradients of hidden (R, D) and weight (V, D) under CPU bf16 autocast: the
    fused projection and loss, or the plain path (F.linear, then label_smoothed_nll of the first n rows)."""
    import translate.training.loss as loss_module

    hidden, weight = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if fused:
            loss, nll = loss_module.ProjectedSmoothedCrossEntropy.apply(hidden, weight, target, eps, torch.bfloat16)
        else:
            loss, nll = label_smoothed_nll(F.linear(hidden, weight)[: target.numel()], target, eps)
    (loss * 0.03).backward()
    return loss, nll, hidden.grad, weight.grad


def test_fused_projection_and_loss_match_the_plain_path(monkeypatch):
    """The fused projection and loss (CPU, bf16) against the plain path in chunks of 3 rows over
    20 real rows of 32: the same loss and NLL bit for bit (the same product, the same chunks),
    gradients within bf16's rounding of the plain path's, at least as close to fp32's, and none
    for the padding rows."""
    import translate.training.loss as loss_module

    monkeypatch.setattr(loss_module, "CHUNK_BYTES", 3 * 4 * 50)  # 3 fp32 rows of 50
    torch.manual_seed(3)
    hidden, weight, target = torch.randn(32, 16), torch.randn(50, 16) * 0.5, torch.randint(0, 50, (20,))
    loss, nll, grad_h, grad_w = projected(True, hidden, weight, target, 0.1, monkeypatch)
    plain_loss, plain_nll, plain_h, plain_w = projected(False, hidden, weight, target, 0.1, monkeypatch)
    assert torch.equal(loss, plain_loss) and torch.equal(nll, plain_nll) and not nll.requires_grad
    assert grad_h.dtype == grad_w.dtype == torch.float32 and grad_h[20:].abs().max() == 0
    torch.testing.assert_close(grad_h, plain_h, rtol=2e-2, atol=2e-4)
    torch.testing.assert_close(grad_w, plain_w, rtol=2e-2, atol=2e-4)
    h32, w32 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    (F.cross_entropy(F.linear(h32[:20], w32), target, label_smoothing=0.1, reduction="sum") * 0.03).backward()
    for got, plain, exact in ((grad_h, plain_h, h32.grad), (grad_w, plain_w, w32.grad)):
        assert (got - exact).norm() <= 1.1 * (plain - exact).norm()


def test_the_objective_fuses_where_it_applies(monkeypatch):
    """LabelSmoothedObjective takes the fused path under CPU bf16 autocast with a gradient to come,
    and the plain one in fp32, under no_grad and with FUSE_PROJECTION off; the two paths give the
    same loss and the model the same gradients within bf16's rounding."""
    import translate.training.loss as loss_module
    from translate.core.config import ModelConfig
    from translate.model import Transformer

    calls = []
    fused = loss_module.ProjectedSmoothedCrossEntropy.apply
    monkeypatch.setattr(loss_module.ProjectedSmoothedCrossEntropy, "apply", lambda *a: calls.append(1) or fused(*a))
    torch.manual_seed(0)
    model = Transformer(ModelConfig(layers=1, d_model=32, d_ff=64, heads=2, vocab_size=100, dropout=0.0))
    objective = loss_module.LabelSmoothedObjective(model, 0.1)
    src, tgt = torch.randint(4, 100, (5, 7)), torch.randint(4, 100, (5, 9))
    select = torch.arange(0, 45, 2)
    target = tgt.flatten()[select]
    results = {}
    for name, fuse in (("fused", True), ("plain", False)):
        monkeypatch.setattr(loss_module, "FUSE_PROJECTION", fuse)
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _ = objective(src, tgt, select, target)
        loss.backward()
        results[name] = loss.detach(), [p.grad.clone() for p in model.parameters()]
    assert len(calls) == 1
    assert torch.equal(results["fused"][0], results["plain"][0])
    for got, want in zip(results["fused"][1], results["plain"][1]):
        torch.testing.assert_close(got, want, rtol=3e-2, atol=1e-3)
    monkeypatch.setattr(loss_module, "FUSE_PROJECTION", True)
    objective(src, tgt, select, target)  # fp32
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        objective(src, tgt, select, target)
    assert len(calls) == 1


def test_the_fused_buffer_is_reused_and_never_shared(monkeypatch):
    """Backward gives the (R, V) buffer back for the next forward; two graphs alive at once each
    have their own, and one that never runs backward costs the next call only a fresh buffer:
    every result equals the one computed alone."""
    import translate.training.loss as loss_module

    monkeypatch.setattr(loss_module, "_workspace", loss_module._Workspace())
    torch.manual_seed(4)
    hidden, weight = torch.randn(3, 8, 16), torch.randn(40, 16)
    targets = torch.randint(0, 40, (3, 6))
    alone = [projected(True, hidden[i], weight, targets[i], 0.1, monkeypatch) for i in range(3)]

    def forward(i):
        h, w = hidden[i].clone().requires_grad_(), weight.clone().requires_grad_()
        loss, _ = loss_module.ProjectedSmoothedCrossEntropy.apply(h, w, targets[i], 0.1, torch.bfloat16)
        return loss, h, w

    pointers = []
    take = loss_module._Workspace.take

    def recorded(self, *args):
        buffer = take(self, *args)
        pointers.append(buffer.data_ptr())
        return buffer

    monkeypatch.setattr(loss_module._Workspace, "take", recorded)
    monkeypatch.setattr(loss_module, "_workspace", loss_module._Workspace())
    first, second = forward(0), forward(1)  # both alive
    abandoned = forward(2)  # never runs backward
    for (loss, h, w), (want, _, want_h, want_w) in ((first, alone[0]), (second, alone[1])):
        (loss * 0.03).backward()
        assert torch.equal(loss, want) and torch.equal(h.grad, want_h) and torch.equal(w.grad, want_w)
    again = forward(2)
    (again[0] * 0.03).backward()
    assert torch.equal(again[0], abandoned[0]) and torch.equal(again[1].grad, alone[2][2])
    assert len(set(pointers[:3])) == 3  # three graphs alive: three buffers
    assert pointers[3] in pointers[:2]  # a buffer given back is taken again


def test_fused_graph_runs_backward_once():
    import translate.training.loss as loss_module

    hidden, weight = torch.randn(4, 8, requires_grad=True), torch.randn(7, 8, requires_grad=True)
    loss, _ = loss_module.ProjectedSmoothedCrossEntropy.apply(hidden, weight, torch.tensor([0, 1, 2]), 0.1, torch.bfloat16)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward twice"):
        loss.backward()


def _rdrop_case(dropout: float):
    from translate.core.config import ModelConfig
    from translate.model import Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(layers=1, d_model=32, d_ff=64, heads=2, vocab_size=100, dropout=dropout))
    src, tgt = torch.randint(4, 100, (5, 7)), torch.randint(4, 100, (5, 9))
    select = torch.arange(0, 45, 2)  # 23 real positions
    return model, src, tgt, select, tgt.flatten()[select]


def test_rdrop_loss_and_gradient_by_hand():
    """train.rdrop: the batch twice through the model (each copy its own dropout masks), the mean
    of the two label-smoothed losses plus alpha / 4 times both KL divergences, written out here
    with F.cross_entropy and p * (log p - log q); gradients alike."""
    from translate.training.loss import LabelSmoothedObjective

    model, src, tgt, select, target = _rdrop_case(dropout=0.3)
    alpha, eps, n = 3.0, 0.1, select.numel()
    torch.manual_seed(1)
    loss, nll = LabelSmoothedObjective(model, eps, rdrop=alpha)(src, tgt, select, target)
    loss.backward()
    ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch.manual_seed(1)  # the same dropout draws: one forward pass over both copies
    logits = model(torch.cat([src, src]), torch.cat([tgt, tgt]), torch.cat([select, select + tgt.numel()]))
    first, second = logits[:n], logits[n:]
    ce = [F.cross_entropy(half, target, label_smoothing=eps, reduction="sum") for half in (first, second)]
    p, q = F.softmax(first, -1), F.softmax(second, -1)
    kl_pq = (p * (p.log() - q.log())).sum()
    kl_qp = (q * (q.log() - p.log())).sum()
    assert kl_pq > 0.1 and kl_qp > 0.1  # the copies' dropout masks differ
    expected = (ce[0] + ce[1]) / 2 + alpha * (kl_pq + kl_qp) / 4
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-4)
    half_nll = sum(F.cross_entropy(half, target, reduction="sum") for half in (first, second)) / 2
    torch.testing.assert_close(nll, half_nll.detach(), rtol=1e-5, atol=1e-4)
    for got, want in zip(ours, (p.grad for p in model.parameters())):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_rdrop_without_dropout_is_the_plain_loss_and_validation_ignores_it():
    """Without dropout the two copies agree, the KL is zero, and R-Drop's loss and gradients are
    the plain objective's; under no_grad (validation) the plain objective runs."""
    from translate.training.loss import LabelSmoothedObjective

    model, src, tgt, select, target = _rdrop_case(dropout=0.0)
    rdrop, plain = LabelSmoothedObjective(model, 0.1, rdrop=5.0), LabelSmoothedObjective(model, 0.1)
    results = []
    for objective in (rdrop, plain):
        model.zero_grad()
        loss, nll = objective(src, tgt, select, target)
        loss.backward()
        results.append((loss.detach(), nll, [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-5, atol=1e-4)
    for got, want in zip(results[0][2], results[1][2]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        assert torch.equal(rdrop(src, tgt, select, target)[0], plain(src, tgt, select, target)[0])
