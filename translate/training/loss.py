"""Label-smoothed cross-entropy (paper, section 5.4), and the training objective built on it."""

from __future__ import annotations

from typing import Optional, Tuple

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


def _chunk_rows(n: int, V: int) -> int:
    """Rows of V fp32 values that fit CHUNK_BYTES (at least 1, at most n)."""
    return max(1, min(n, CHUNK_BYTES // (4 * V)))


def _chunked_gradient(logits: Tensor, target: Tensor, label_smoothing: float) -> Tuple[Tensor, Tensor, Tensor]:
    """The gradient softmax - q of 16-bit logits (N, V) on the CPU, in their dtype, and the summed
    smoothed loss and NLL (_smoothed_gradient into a new tensor)."""
    grad = torch.empty_like(logits)  # (N, V)
    loss, nll = _smoothed_gradient(logits, target, label_smoothing, out=grad)
    return grad, loss, nll


class ProjectedSmoothedCrossEntropy(torch.autograd.Function):
    """The pre-softmax projection and label_smoothed_nll as one step, for 16-bit products on the
    CPU: hidden states (R, D) times the shared embedding (V, D) into one (R, V) buffer that
    outlives the call, whose rows then become the gradient softmax - q in place
    (_smoothed_gradient). Apart, the projection's output, the gradient, its scaling by the
    loss's gradient and, for padded rows, a zero-filled copy are each a fresh (R, V) tensor;
    here the buffer is written twice (the product, the gradient), backward scales only the
    (R, D) and (V, D) products, in fp32 (one rounding fewer), and no speed depends on the
    allocator reusing freed blocks (host_memory). As users train, on a Zen 5, the loop was no
    faster for it (docs/results.md, issue 53). Rows n..R-1 (ROW_MULTIPLE's padding) count for nothing."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, target: Tensor, label_smoothing: float,
                dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        with torch.autocast("cpu", enabled=False):  # explicit dtypes: out= products take no autocast
            h, w = hidden.to(dtype), weight.to(dtype)  # (R, D), (V, D)
            buffer = _workspace.take(h.size(0), w.size(0), dtype)  # (R, V)
            torch.mm(h, w.t(), out=buffer)  # logits
            loss, nll_sum = _smoothed_gradient(buffer, target, label_smoothing, out=buffer)
        ctx.save_for_backward(h, w)
        ctx.buffer, ctx.dtypes = buffer, (hidden.dtype, weight.dtype)
        ctx.mark_non_differentiable(nll_sum)
        return loss, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        grad, ctx.buffer = ctx.buffer, None  # (R, V): softmax - q
        if grad is None:
            raise RuntimeError("ProjectedSmoothedCrossEntropy's graph ran backward twice: its buffer was given back")
        h, w = ctx.saved_tensors
        scale = grad_loss.float()
        with torch.autocast("cpu", enabled=False):
            # Scaled after the product, in fp32: (R, D) and (V, D) instead of (R, V), one rounding.
            grad_hidden = torch.mm(grad, w).float().mul_(scale).to(ctx.dtypes[0])  # (R, D)
            grad_weight = torch.mm(grad.t(), h).float().mul_(scale).to(ctx.dtypes[1])  # (V, D)
        _workspace.give_back(grad)
        return grad_hidden, grad_weight, None, None, None


def _smoothed_gradient(logits: Tensor, target: Tensor, label_smoothing: float, out: Tensor) -> Tuple[Tensor, Tensor]:
    """The gradient softmax - q of the summed smoothed loss of 16-bit logits (R, V) into out (R, V)
    (which may be logits itself), where target (n,) covers rows 0..n-1; rows n..R-1 of out become
    zero. Returns the summed smoothed loss and NLL (fp32 scalars).

    A few rows at a time in one fp32 scratch buffer: the whole-tensor form writes (R, V) fp32
    tensors to memory several times (log-softmax, exp, the cast back), each pass bound by memory
    bandwidth; here a chunk's passes stay in cache."""
    (R, V), n = logits.shape, target.numel()
    eps = label_smoothing
    rows = _chunk_rows(n, V)
    scratch = logits.new_empty((rows, V), dtype=torch.float32)
    gold = logits.new_empty((n, 1), dtype=torch.float32)  # each target's log-probability
    mean = logits.new_empty((n,), dtype=torch.float32)  # each row's mean log-probability
    for start in range(0, n, rows):
        end = min(start + rows, n)
        log_probs, chunk_target = scratch[: end - start], target[start:end, None]  # (k, V), (k, 1)
        log_probs.copy_(logits[start:end])
        torch._log_softmax(log_probs, 1, False, out=log_probs)
        torch.gather(log_probs, 1, chunk_target, out=gold[start:end])
        torch.mean(log_probs, 1, out=mean[start:end])
        softmax = log_probs.exp_().sub_(eps / V)  # softmax - eps / V
        softmax.scatter_add_(1, chunk_target, softmax.new_full(chunk_target.shape, -(1.0 - eps)))  # - (1 - eps) at the target
        out[start:end].copy_(softmax)
    out[n:].zero_()
    nll = -gold.sum()
    return (1.0 - eps) * nll - eps * mean.sum(), nll


class _Workspace:
    """(R, V) buffers for ProjectedSmoothedCrossEntropy, kept between updates: handed out by
    forward, given back by backward, so that a graph that never runs backward only costs a
    fresh one. One flat block per dtype, as large as the largest R * V met."""

    def __init__(self):
        self.free: dict = {}  # dtype -> flat tensor

    def take(self, rows: int, columns: int, dtype: torch.dtype) -> Tensor:
        block = self.free.pop(dtype, None)
        if block is None or block.numel() < rows * columns:
            block = torch.empty(rows * columns, dtype=dtype)
        return block[: rows * columns].view(rows, columns)

    def give_back(self, buffer: Tensor) -> None:
        block = buffer._base if buffer._base is not None else buffer
        kept = self.free.get(buffer.dtype)
        if kept is None or kept.numel() < block.numel():
            self.free[buffer.dtype] = block


_workspace = _Workspace()

# Whether LabelSmoothedObjective fuses the projection with the loss where it can
# (fused_product_dtype); False: the plain path, for comparison (tests).
FUSE_PROJECTION = True


def fused_product_dtype(hidden: Tensor) -> Optional[torch.dtype]:
    """The 16-bit dtype ProjectedSmoothedCrossEntropy computes hidden's products in (autocast's, or
    hidden's own), where it serves: CPU training that will run backward; None elsewhere (fp32,
    no_grad, other devices; compiled graphs fuse the plain form themselves)."""
    if not FUSE_PROJECTION or hidden.device.type != "cpu" or not torch.is_grad_enabled() or torch.compiler.is_compiling():
        return None
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else hidden.dtype
    return None if dtype == torch.float32 else dtype


# The vocabulary projection's rows are rounded up to a multiple of this. Every batch has its own
# number of real target tokens, and oneDNN (CPU bf16 products) compiles and keeps a kernel for
# each shape of product it meets (host_memory.keep_compiled_products): rounding makes the shapes
# repeat, so fewer kernels are compiled and kept. The extra rows cost at most 63 / N of the projection.
ROW_MULTIPLE = 64


class LabelSmoothedObjective(nn.Module):
    """What training minimizes: the model's logits at the real target positions, then
    label_smoothed_nll. One module, so that the vocabulary projection and the loss run as one
    step: torch.compile (train.compile) fuses them on a GPU, where run apart the cast to fp32,
    log-softmax, mean, gather and their backward write (N, V) fp32 tensors about ten times, a
    large share of a step; on the CPU in 16 bits, ProjectedSmoothedCrossEntropy does (its profile
    before and after: docs/results.md)."""

    def __init__(self, model: nn.Module, label_smoothing: float, rdrop: float = 0.0):
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing
        self.rdrop = rdrop  # R-Drop's alpha (train.rdrop); used only where a gradient follows

    def forward(self, src: Tensor, tgt_in: Tensor, select: Tensor, target: Tensor) -> Tuple[Tensor, Tensor]:
        """(B, S), (B, T), (N,) flat real target positions, (N,) their ids -> summed loss, summed NLL."""
        if self.rdrop > 0 and torch.is_grad_enabled():
            return self._rdrop(src, tgt_in, select, target)
        n = select.numel()
        hidden = self.model.selected_states(src, tgt_in, _rounded(select))  # (rows, D)
        dtype = fused_product_dtype(hidden)
        if dtype is not None:
            return ProjectedSmoothedCrossEntropy.apply(hidden, self.model.output_weight(), target,
                                                       self.label_smoothing, dtype)
        return label_smoothed_nll(self.model.logits(hidden)[:n], target, self.label_smoothing)

    def _rdrop(self, src: Tensor, tgt_in: Tensor, select: Tensor, target: Tensor) -> Tuple[Tensor, Tensor]:
        """R-Drop (train.rdrop): the batch twice in one forward pass, so that each copy draws its
        own dropout masks, then RDropLoss on the two copies' logits."""
        n = select.numel()
        both = torch.cat([select, select + tgt_in.numel()])  # (2N,) the second copy's positions follow the first's
        hidden = self.model.selected_states(torch.cat([src, src]), torch.cat([tgt_in, tgt_in]), _rounded(both))
        return RDropLoss.apply(self.model.logits(hidden), target, self.label_smoothing, self.rdrop)  # logits (rows, V)


class RDropLoss(torch.autograd.Function):
    """R-Drop's loss (Liang et al. 2021) on two passes' logits of the same N targets, rows [0, N)
    and [N, 2N) of (rows, V) (rows past 2N: padding, with no loss and a zero gradient):

        (CE_1 + CE_2) / 2 + alpha * (KL(P_1 || P_2) + KL(P_2 || P_1)) / 4,

    summed over the targets, CE label-smoothed: the paper's CE_1 + CE_2 + alpha / 2 * (both KLs),
    halved so that its scale stays one pass's (the gradient clip's threshold means the same). Also
    returns the two passes' mean NLL. Both KLs together are sum_v (p1 - p2)(log p1 - log p2),
    whose gradient on the first pass's logits is p1 (d - E_p1[d]) + p1 - p2 with d = log p1 - log p2
    (and alike on the second's): like SmoothedCrossEntropy, the forward pass writes the gradient
    into one (rows, V) buffer, a few rows at a time in fp32, which autograd's form (log-softmax,
    gather, mean and two KLs of (2N, V) fp32 tensors, and their backward) would write many times."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, label_smoothing: float, alpha: float) -> Tuple[Tensor, Tensor]:
        n, V = target.numel(), logits.size(1)
        grad = torch.empty_like(logits)  # (rows, V)
        grad[2 * n:] = 0  # the rounding's padding rows
        c, smooth = alpha / 4, label_smoothing / (2 * V)
        ce = nll = kl = logits.new_zeros((), dtype=torch.float32)
        rows = _chunk_rows(n, V)
        for start in range(0, n, rows):
            end = min(start + rows, n)
            gold = target[start:end, None]  # (k, 1)
            a = F.log_softmax(logits[start:end], dim=-1, dtype=torch.float32)  # (k, V) log p1
            b = F.log_softmax(logits[n + start:n + end], dim=-1, dtype=torch.float32)  # (k, V) log p2
            gold_sum = a.gather(1, gold).sum() + b.gather(1, gold).sum()
            nll = nll - gold_sum
            ce = ce - (1.0 - label_smoothing) * gold_sum - label_smoothing * (a.mean(dim=-1).sum() + b.mean(dim=-1).sum())
            p1, p2, d = a.exp(), b.exp(), a - b  # (k, V) each
            kl = kl + ((p1 - p2) * d).sum()
            e1, e2 = (p1 * d).sum(-1, keepdim=True), (p2 * d).sum(-1, keepdim=True)  # (k, 1) E_p1[d], E_p2[d]
            for out, p, other, shift in ((grad[start:end], p1, p2, d.sub(e1)), (grad[n + start:n + end], p2, p1, e2 - d)):
                g = p * (0.5 + c * (shift + 1.0)) - c * other - smooth  # (k, V): softmax / 2 and the KLs' part, less q's uniform half
                g.scatter_add_(1, gold, g.new_full(gold.shape, -(1.0 - label_smoothing) / 2))  # q's one-hot half
                out.copy_(g)
        ctx.grad = grad
        ctx.mark_non_differentiable(nll)
        return ce / 2 + c * kl, nll / 2

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor) -> Tuple[Tensor, None, None, None]:
        grad, ctx.grad = ctx.grad, None  # a second backward fails, as SmoothedCrossEntropy's
        return grad.mul_(grad_loss.to(grad.dtype)), None, None, None


def _rounded(select: Tensor) -> Tensor:
    """select (N,) with position 0 appended up to a multiple of ROW_MULTIPLE rows: rows the loss
    leaves out, so that their gradient is zero."""
    n = select.numel()
    rows = -(-n // ROW_MULTIPLE) * ROW_MULTIPLE
    return torch.cat([select, select.new_zeros(rows - n)]) if rows > n else select  # (rows,)
