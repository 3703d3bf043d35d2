"""Mixed precision for training: which one a device gets, its autocast and fp16's loss scaler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from translate.config import Precision

_DTYPES = {Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16}


@dataclass
class MixedPrecision:
    """The precision of a training run on its device."""

    precision: Precision  # never auto
    device: torch.device
    autocast: Optional[torch.autocast]  # the forward pass in bf16 or fp16 (weights stay fp32); None for fp32
    scaler: Optional["torch.amp.GradScaler"]  # fp16's loss scaling; None otherwise

    @classmethod
    def on(cls, precision: Precision, device: torch.device) -> "MixedPrecision":
        """auto: bf16 on GPUs, fp32 on CPUs (bf16 matrix products are emulated, and slow, on most CPUs)."""
        if precision == Precision.auto:
            precision = Precision.bf16 if device.type == "cuda" else Precision.fp32
        autocast = None if precision == Precision.fp32 else torch.autocast(device.type, dtype=_DTYPES[precision])
        scaler = torch.amp.GradScaler(device.type) if precision == Precision.fp16 else None
        return cls(precision, device, autocast, scaler)

    def peak_dtype(self) -> torch.dtype:
        """The dtype whose matrix-product peak the MFU is measured against: the training
        precision's on GPUs; fp32 on CPUs, where bf16 and fp16 products are emulated."""
        return _DTYPES.get(self.precision, torch.float32) if self.device.type == "cuda" else torch.float32
