"""Label-smoothed cross-entropy (paper, section 5.4), and the training objective built on it."""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def label_smoothed_nll(logits: Tensor, target: Tensor, label_smoothing: float) -> Tuple[Tensor, Tensor]:
    """Summed loss against q = (1 - eps) * one_hot(target) + eps / V, and the summed NLL.

    logits (N, V) and target (N,) cover real (non-padding) target positions only; the caller
    divides by the number of target tokens. Equals F.cross_entropy(label_smoothing=eps,
    reduction="sum"), and also returns the unsmoothed NLL for perplexity (not differentiable).
    """
    # Compiled, the compiler fuses the plain form itself; without a gradient to come (validation,
    # under no_grad), the written-out gradient would be work for nothing.
    if torch.compiler.is_compiling() or not (torch.is_grad_enabled() and logits.requires_grad):
        return _plain(logits, target, label_smoothing)
    return SmoothedCrossEntropy.apply(logits, target, label_smoothing)


def _terms(logits: Tensor, target: Tensor, label_smoothing: float) -> Tuple[Tensor, Tensor, Tensor]:
    """log-probabilities (N, V) in fp32, the summed smoothed loss and the summed NLL."""
    log_probs = F.log_softmax(logits, dim=-1, dtype=torch.float32)  # (N, V)
    nll = -log_probs.gather(1, target[:, None]).squeeze(1)  # (N,)
    smooth = -log_probs.mean(dim=-1)  # (N,) cross-entropy against the uniform distribution
    loss = (1.0 - label_smoothing) * nll + label_smoothing * smooth
    return log_probs, loss.sum(), nll.sum()


def _plain(logits: Tensor, target: Tensor, label_smoothing: float) -> Tuple[Tensor, Tensor]:
    _, loss, nll = _terms(logits, target, label_smoothing)
    return loss, nll.detach()


class SmoothedCrossEntropy(torch.autograd.Function):
    """label_smoothed_nll with its gradient written out, softmax - q, into the one (N, V) buffer
    that the forward pass keeps: its log-probabilities, or on the CPU in 16 bits the gradient
    itself (_chunked_gradient). Autograd's own backward of the plain form allocates and writes
    (N, V) tensors about five times (the mean's, the gather's, their sum, log-softmax's), a
    tenth of a CPU update at an 8k vocabulary. The graph can run backward once (as training
    does): the buffer becomes the gradient."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, label_smoothing: float) -> Tuple[Tensor, Tensor]:
        ctx.target, ctx.label_smoothing, ctx.dtype = target, label_smoothing, logits.dtype
        ctx.chunked = logits.device.type == "cpu" and logits.dtype != torch.float32 and CHUNK_BYTES > 0
        if ctx.chunked:  # the buffer: softmax - q already, in the logits' dtype
            ctx.buffer, loss, nll_sum = _chunked_gradient(logits, target, label_smoothing)
        else:  # the buffer: fp32 log-probabilities
            ctx.buffer, loss, nll_sum = _terms(logits, target, label_smoothing)
        ctx.mark_non_differentiable(nll_sum)
        return loss, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor) -> Tuple[Tensor, None, None]:
        grad, ctx.buffer = ctx.buffer, None
        if grad is None:
            raise RuntimeError("SmoothedCrossEntropy's graph ran backward twice: its buffer is already the gradient")
        if ctx.chunked:
            return grad.mul_(grad_loss), None, None
        N, V = grad.shape
        eps = ctx.label_smoothing
        grad.exp_().sub_(eps / V)  # softmax - eps / V
        rows = torch.arange(N, device=grad.device)
        grad.index_put_((rows, ctx.target), grad.new_tensor(-(1.0 - eps)), accumulate=True)  # - (1 - eps) at the target
        grad.mul_(grad_loss)
        return grad.to(ctx.dtype), None, None


# Bytes of fp32 log-probabilities that _chunked_gradient works on at a time: small enough to stay
# in a CPU's caches between its passes, so each pass reads cache instead of memory
# (scripts/bench_loss.py measures it against the whole-tensor passes). 0 turns chunking off.
CHUNK_BYTES = 4 * 2**20


def _chunked_gradient(logits: Tensor, target: Tensor, label_smoothing: float) -> Tuple[Tensor, Tensor, Tensor]:
    """The gradient softmax - q of 16-bit logits (N, V) on the CPU, in their dtype, and the summed
    smoothed loss and NLL, computed a few rows at a time in one fp32 scratch buffer. The
    whole-tensor form writes (N, V) fp32 tensors to memory several times (log-softmax, exp, the
    cast back), each pass bound by memory bandwidth; here a chunk's passes stay in cache, and
    what backward keeps is the 16-bit gradient instead of fp32 log-probabilities."""
    N, V = logits.shape
    eps = label_smoothing
    rows = max(1, min(N, CHUNK_BYTES // (4 * V)))
    grad = torch.empty_like(logits)  # (N, V)
    scratch = logits.new_empty((rows, V), dtype=torch.float32)
    gold = logits.new_empty((N, 1), dtype=torch.float32)  # each target's log-probability
    mean = logits.new_empty((N,), dtype=torch.float32)  # each row's mean log-probability
    for start in range(0, N, rows):
        end = min(start + rows, N)
        log_probs, chunk_target = scratch[: end - start], target[start:end, None]  # (n, V), (n, 1)
        log_probs.copy_(logits[start:end])
        torch._log_softmax(log_probs, 1, False, out=log_probs)
        torch.gather(log_probs, 1, chunk_target, out=gold[start:end])
        torch.mean(log_probs, 1, out=mean[start:end])
        softmax = log_probs.exp_().sub_(eps / V)  # softmax - eps / V
        softmax.scatter_add_(1, chunk_target, softmax.new_full(chunk_target.shape, -(1.0 - eps)))  # - (1 - eps) at the target
        grad[start:end].copy_(softmax)
    nll = -gold.sum()
    loss = (1.0 - eps) * nll - eps * mean.sum()
    return grad, loss, nll


# The vocabulary projection's rows are rounded up to a multiple of this. Every batch has its own
# number of real target tokens, and oneDNN (CPU bf16 products) compiles and keeps a kernel for
# each shape of product it meets (host_memory.keep_compiled_products): rounding makes the shapes
# repeat, so fewer kernels are compiled and kept. The extra rows cost at most 63 / N of the projection.
ROW_MULTIPLE = 64


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
        n = select.numel()
        rows = -(-n // ROW_MULTIPLE) * ROW_MULTIPLE
        if rows > n:  # position 0 again: rows the loss leaves out, so their gradient is zero
            select = torch.cat([select, select.new_zeros(rows - n)])  # (rows,)
        return label_smoothed_nll(self.model(src, tgt_in, select)[:n], target, self.label_smoothing)
