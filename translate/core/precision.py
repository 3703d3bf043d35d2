"""Mixed precision for training: which one a device gets, its autocast and fp16's loss scaler."""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from translate.core.choices import Precision

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
        """auto: bf16 on GPUs and on CPUs that compute bf16 products natively (native_bf16);
        fp32 on other CPUs, which emulate bf16 products, slowly."""
        precision = resolved(precision, device)
        autocast = None if precision == Precision.fp32 else torch.autocast(device.type, dtype=_DTYPES[precision])
        scaler = torch.amp.GradScaler(device.type) if precision == Precision.fp16 else None
        return cls(precision, device, autocast, scaler)

    def peak_dtype(self) -> torch.dtype:
        """The dtype whose matrix-product peak the MFU is measured against: the training
        precision's on GPUs, and bf16's on CPUs that compute it natively; else fp32 (emulated
        bf16 and fp16 products are slower than fp32's)."""
        if self.device.type == "cuda" or (self.precision == Precision.bf16 and native_bf16()):
            return _DTYPES.get(self.precision, torch.float32)
        return torch.float32


def resolved(precision: Precision, device: torch.device) -> Precision:
    """auto as the device calls for it: bf16 on GPUs and on CPUs with native bf16, else fp32;
    any other precision as it is (training and decoding share this rule)."""
    if precision != Precision.auto:
        return precision
    return Precision.bf16 if device.type == "cuda" or native_bf16() else Precision.fp32


# The x86 flags (AVX512-BF16, AMX) and the Arm feature (FEAT_BF16) of bf16 dot products in hardware.
_BF16_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}


def _cpuinfo_field(names) -> Optional[str]:
    """The value of the first /proc/cpuinfo line naming one of `names` (Linux), else None."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1] for line in lines if line.startswith(names)), None)


def cpu_model() -> str:
    """The CPU's model name, as lscpu names it ("AMD EPYC"), for records of where figures were
    measured; "unknown" where the system does not say."""
    name = _cpuinfo_field(("model name",))
    return name.strip() if name else (platform.processor() or "unknown")


def cpu_family_model() -> str:
    """"family F model M" of the CPU, from /proc/cpuinfo: what tells generations apart where the
    model name does not (an "AMD EPYC" is a Zen 3, 4 or 5); "" where the system does not say."""
    family, model = _cpuinfo_field(("cpu family",)), _cpuinfo_field(("model\t", "model :"))
    return f"family {family.strip()} model {model.strip()}" if family and model else ""


def isa() -> str:
    """The instructions torch's CPU kernels dispatch to here ("AVX512", "AVX2", "DEFAULT"; the
    environment's ATEN_CPU_CAPABILITY may lower it), for records of how figures were computed."""
    return torch.backends.cpu.get_cpu_capability()


@functools.lru_cache(maxsize=None)
def native_bf16() -> bool:
    """Whether this machine's CPU computes bf16 matrix products in hardware, from Linux's
    /proc/cpuinfo (elsewhere: no). On one with AMX, a 4,096x256 by 256x1,024 product ran 9x
    faster in bf16 than in fp32; on CPUs without, bf16 is emulated and slower than fp32."""
    if platform.system() != "Linux" or not _onednn_may_use_bf16():
        return False
    flags = _cpuinfo_field(("flags", "Features"))
    return flags is not None and bool(_BF16_FLAGS & set(flags.split()))


def _onednn_may_use_bf16() -> bool:
    """False where ONEDNN_MAX_CPU_ISA (or its old name DNNL_MAX_CPU_ISA) caps oneDNN below its
    bf16 instructions (AVX2, AVX512_CORE, ...): its bf16 products are then emulated, as on a CPU
    without them, so a run forced down to AVX2 trains in fp32 as an AVX2 CPU's would. The ISAs
    that keep bf16 name it (AVX512_CORE_BF16), or AMX or FP16, or are AVX10 or ALL."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").upper()
    return cap == "ALL" or cap.startswith("AVX10") or any(word in cap for word in ("BF16", "AMX", "FP16"))
