"""The CPU kernels under the model (translate/kernels.py): the dropout's masks. Decoding's
prepacked products are tested with the model's steps, in tests/test_model.py."""

import torch

from translate.kernels import Dropout


def test_dropout_rate_scale_and_gradient():
    """The CPU dropout drops a share p of elements (here within 5 standard deviations of a
    million draws), independently of its neighbours (four share a random integer), scales the
    rest by 1 / (1 - p), passes gradients through the same mask, repeats under the same seed,
    keeps odd shapes, and is the identity in eval mode and at p = 0."""
    p, n = 0.1, 1_000_001  # not a multiple of 4
    x = (torch.rand(n) + 0.5).requires_grad_()  # no zeros: a zero output means dropped
    dropout = Dropout(p)
    torch.manual_seed(3)
    out = dropout(x)
    dropped = out == 0
    assert abs(dropped.float().mean().item() - p) < 5 * (p * (1 - p) / n) ** 0.5
    quads = dropped[: n - 1].view(-1, 4).float()  # (n/4, 4): the four drawn from one integer
    for i in range(3):  # neighbours dropped together as often as chance says: p^2
        assert abs((quads[:, i] * quads[:, i + 1]).mean().item() - p * p) < 5 * (p * p / (n / 4)) ** 0.5
    for rate in (0.3, 0.02):
        share = (Dropout(rate)(torch.ones(n)) == 0).float().mean().item()
        assert abs(share - rate) < 5 * (rate * (1 - rate) / n) ** 0.5
    assert Dropout(p)(torch.ones(3, 5, 7)).shape == (3, 5, 7)
    torch.testing.assert_close(out[~dropped], x[~dropped] / (1 - p))
    out.sum().backward()
    torch.testing.assert_close(x.grad, (~dropped).float() / (1 - p))
    torch.manual_seed(3)
    assert torch.equal(dropout(x), out)
    assert torch.equal(dropout.eval()(x), x)
    assert torch.equal(Dropout(0.0)(x), x)
    assert dropout.train()(x.detach().bfloat16()).dtype == torch.bfloat16
