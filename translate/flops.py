"""Compute accounting: model FLOPs per target token, the device's peak, and the paper's budget."""

from __future__ import annotations

import time

import torch

from translate.config import ModelConfig

# Training compute the paper reports (Table 2), in FLOPs.
PAPER_COMPUTE = {512: 3.3e18, 1024: 2.3e19}  # by d_model: base, big


def flops_per_target_token(cfg: ModelConfig, src_len: float, tgt_len: float) -> float:
    """Training FLOPs (forward + backward = 3 x forward) per target token: 6 x the weights a
    token passes through (the tied output projection included), plus the attention products,
    for sentences of these average lengths."""
    d, f, n, v = cfg.d_model, cfg.d_ff, cfg.layers, cfg.vocab_size
    per_source = src_len / tgt_len  # source tokens per target token
    encoder = n * (4 * d * d + 2 * d * f) * per_source
    decoder = n * (8 * d * d + 2 * d * f)
    projection = d * v
    attention = 2 * n * d * (src_len * per_source + tgt_len / 2 + src_len)  # QK^T and AV
    return 6 * (encoder + decoder + projection + attention)


def matmul_peak(device: torch.device, dtype: torch.dtype = torch.float32, seconds: float = 1.0) -> float:
    """Measured FLOP/s of a large square matrix product on this device and dtype."""
    n = 8192 if device.type == "cuda" else 2048
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    _synchronize(device)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
        if device.type == "cuda" and count % 20:
            continue
        _synchronize(device)
    _synchronize(device)
    return 2 * n**3 * count / (time.perf_counter() - start)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
