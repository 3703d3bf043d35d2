"""Compute accounting: model FLOPs per target token, the device's peak, and the paper's budget."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from translate.core.config import ModelConfig
from translate.core.errors import TranslateError
from translate.core.paths import atomic_write
from translate.core.precision import cpu_model

# Seconds of start-up the peak's measurement (matmul_peak) takes.
PEAK_SECONDS = 1.25

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


def matmul_peak(device: torch.device, dtype: torch.dtype = torch.float32, seconds: float = 1.0,
                windows: int = 16, size: Optional[int] = None) -> float:
    """Measured peak FLOP/s of square matrix products (size x size) on this device and dtype:
    the best of `windows` timed windows, after one window's warm-up, about `seconds` in all.
    On a GPU, products of 8,192. On a CPU, one thread's products of 512 times the threads torch
    runs: one all-thread window would time the kernel's first calls and be halved by any other
    process holding a core. The warm-up takes the first calls out, the best window short
    interruptions, and one thread needs only one free core."""
    n = size or (8192 if device.type == "cuda" else 512)
    # Its own generator: measuring leaves the training's random stream (dropout) as it was.
    generator = torch.Generator(device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
    threads = torch.get_num_threads() if device.type == "cpu" else 1
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        window = seconds / (windows + 1)
        _products_for(a, b, window)  # warm-up, untimed
        best = 0.0
        for _ in range(windows):
            count, took = _products_for(a, b, window)
            best = max(best, 2 * n**3 * count / took)
    finally:
        if device.type == "cpu":
            torch.set_num_threads(threads)
    return threads * best


def _products_for(a: Tensor, b: Tensor, seconds: float) -> Tuple[int, float]:
    """Products a @ b back to back for at least `seconds` (at least two of them): how many,
    and the seconds they took, waited for on a GPU."""
    device = a.device
    _synchronize(device)
    count, start = 0, time.perf_counter()
    while count < 2 or time.perf_counter() - start < seconds:
        a @ b
        count += 1
        if device.type == "cuda" and count % 20:  # a GPU queues products: wait for them now and then
            continue
        _synchronize(device)
    _synchronize(device)
    return count, time.perf_counter() - start


def machine_peak(device: torch.device, dtype: torch.dtype, measured: float,
                 record: Optional[Path] = None) -> Tuple[float, int]:
    """The best peak this machine has shown for these products, this start-up's `measured`
    included, and how many start-ups measured it: (FLOP/s, start-ups).

    A measurement of a second or so cannot outlast a shared machine's slow spells, which move
    the peak while training's throughput stays the same. The best of every start-up, kept in `record` ($XDG_CACHE_HOME/translate/
    matmul_peaks.json) under the processor, the instructions its libraries may use, the
    dtype and the threads, is a peak that stops moving. A record that cannot be read or
    written leaves this start-up's measurement alone."""
    record = record or _peak_record_path()
    key = _machine_key(device, dtype)
    try:
        records = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else {}
        best, start_ups = records.get(key, (0.0, 0))
        best, start_ups = max(float(best), measured), int(start_ups) + 1
    except (OSError, ValueError, TypeError):
        return measured, 1
    records[key] = (best, start_ups)
    try:
        with atomic_write(record) as out:  # creates the folder
            json.dump(records, out, indent=1)
    except (OSError, TranslateError):
        pass
    return best, start_ups


def _peak_record_path() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "translate" / "matmul_peaks.json"


def _machine_key(device: torch.device, dtype: torch.dtype) -> str:
    """What the peak depends on: the processor, the instructions torch, oneDNN and MKL may use
    (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS narrow them), the dtype
    and the threads; on a GPU, its name."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} | {dtype}"
    limits = "".join(f" {name}={os.environ[name]}" for name in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
                     if os.environ.get(name))
    return f"{cpu_model()} | {torch.backends.cpu.get_cpu_capability()}{limits} | {dtype} | {torch.get_num_threads()} threads"


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
    peak_dtype: torch.dtype = torch.float32  # the dtype whose products the peak timed
    peak_start_ups: int = 1  # the start-ups on this machine whose best the peak is (machine_peak)

    @classmethod
    def measure(cls, cfg: ModelConfig, src_len: float, tgt_len: float, device: torch.device, dtype: torch.dtype,
                processes: int, main: bool) -> "Accounting":
        """FLOPs per token at these average lengths (EOS included) and the device's peak in
        `dtype`, measured on the main process only (the others would measure it alike)."""
        peak, start_ups = (machine_peak(device, dtype, matmul_peak(device, dtype, seconds=PEAK_SECONDS))
                           if main else (0.0, 0))
        paper = PAPER_COMPUTE.get(cfg.d_model) if cfg.layers == 6 else None
        return cls(flops_per_target_token(cfg, src_len, tgt_len), peak * processes, paper, device, peak_dtype=dtype,
                   peak_start_ups=start_ups)

    def peak_label(self) -> str:
        """The peak MFU divides by, e.g. "0.42 TFLOP/s bf16 peak (best of 3 start-ups)" (all
        processes together; the start-ups on this machine that measured it)."""
        name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(self.peak_dtype, str(self.peak_dtype))
        label = f"{self.peak_flops / 1e12:.2f} TFLOP/s {name} peak"
        if self.peak_start_ups > 1:
            label += f" (best of {self.peak_start_ups} start-ups)"
        return label

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
