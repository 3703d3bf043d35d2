"""Compute accounting: model FLOPs per target token, the device's peak, and the paper's budget."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, Optional

import torch

from translate.config import ModelConfig

# Training compute the paper reports (Table 2), in FLOPs.
PAPER_COMPUTE = {512: 3.3e18, 1024: 2.3e19}  # by d_model: base, big


def flops_per_target_token(cfg: ModelConfig, src_len: float, tgt_len: float) -> float:
    """Training FLOPs (forward + backward = 3 x forward) per target token: 6 x the weights a
    token passes through (the tied output projection included), plus the attention products,
    for sentences of these average lengths. hk, hv: all heads' query/key and value widths."""
    d, f, n, v = cfg.d_model, cfg.d_ff, cfg.layers, cfg.vocab_size
    hk, hv = cfg.heads * cfg.key_width, cfg.heads * cfg.value_width
    per_source = src_len / tgt_len  # source tokens per target token
    attention_weights = 2 * d * hk + 2 * d * hv  # Q and K, V and the output projection
    encoder = n * (attention_weights + 2 * d * f) * per_source
    # Self-attention; encoder-decoder attention's Q and output per target token, its K and V per
    # source token (they project the encoder's output).
    decoder = n * (attention_weights + (d * hk + d * hv) * (1 + per_source) + 2 * d * f)
    projection = d * v
    attention = n * (hk + hv) * (src_len * per_source + tgt_len / 2 + src_len)  # QK^T and AV
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


@dataclass
class Accounting:
    """What the training logs report about compute: model FLOPs per target token at the
    corpus's average lengths, the measured peak of all processes, and the FLOPs done so far."""

    flops_per_token: float
    peak_flops: float  # FLOP/s of all processes together; 0 where not measured
    paper_compute: Optional[float]  # the paper's training FLOPs for this model size (Table 2)
    device: torch.device
    done: float = 0.0  # model FLOPs of this run so far

    @classmethod
    def measure(cls, cfg: ModelConfig, src_len: float, tgt_len: float, device: torch.device, dtype: torch.dtype,
                processes: int, main: bool) -> "Accounting":
        """FLOPs per token at these average lengths (EOS included) and the device's peak in
        `dtype`, measured on the main process only (the others would measure it alike)."""
        peak = matmul_peak(device, dtype, seconds=0.5) if main else 0.0
        paper = PAPER_COMPUTE.get(cfg.d_model) if cfg.layers == 6 else None
        return cls(flops_per_target_token(cfg, src_len, tgt_len), peak * processes, paper, device)

    def window(self, target_tokens: int, seconds: float) -> Dict[str, float]:
        """Throughput, MFU, memory and compute of the target tokens trained in `seconds`."""
        rate = target_tokens / seconds
        self.done += target_tokens * self.flops_per_token
        metrics = {
            "target_tokens_per_s": rate,
            "mfu": rate * self.flops_per_token / self.peak_flops if self.peak_flops else 0.0,
            "peak_memory_gb": self.peak_memory_gb(),
            "model_flops": self.done,
        }
        if self.paper_compute:
            metrics["paper_compute_share"] = self.done / self.paper_compute
        return metrics

    def peak_memory_gb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**30
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB -> GB
