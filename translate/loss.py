"""Label-smoothed cross-entropy (paper, section 5.4), and the training objective built on it."""

from __future__ import annotations

from typing import Tuple

import torch.nn.functional as F
from torch import Tensor, nn


def label_smoothed_nll(logits: Tensor, target: Tensor, label_smoothing: float) -> Tuple[Tensor, Tensor]:
    """Summed loss against q = (1 - eps) * one_hot(target) + eps / V, and the summed NLL.

    logits (N, V) and target (N,) cover real (non-padding) target positions only; the caller
    divides by the number of target tokens. Equals F.cross_entropy(label_smoothing=eps,
    reduction="sum"), and also returns the unsmoothed NLL for perplexity.
    """
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (N, V)
    nll = -log_probs.gather(1, target[:, None]).squeeze(1)  # (N,)
    smooth = -log_probs.mean(dim=-1)  # (N,) cross-entropy against the uniform distribution
    loss = (1.0 - label_smoothing) * nll + label_smoothing * smooth
    return loss.sum(), nll.sum()


class LabelSmoothedObjective(nn.Module):
    """What training minimizes: the model's logits at the real target positions, then
    label_smoothed_nll. One module, so that torch.compile (train.compile) fuses the loss with
    the vocabulary projection: run apart, the cast to fp32, log-softmax, mean, gather and
    their backward write (N, V) fp32 tensors about ten times, a large share of a GPU step."""

    def __init__(self, model: nn.Module, label_smoothing: float):
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing

    def forward(self, src: Tensor, tgt_in: Tensor, select: Tensor, target: Tensor) -> Tuple[Tensor, Tensor]:
        """(B, S), (B, T), (N,) flat real target positions, (N,) their ids -> summed loss, summed NLL."""
        return label_smoothed_nll(self.model(src, tgt_in, select), target, self.label_smoothing)
