"""Label-smoothed cross-entropy (paper, section 5.4)."""

from __future__ import annotations

from typing import Tuple

import torch.nn.functional as F
from torch import Tensor


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
