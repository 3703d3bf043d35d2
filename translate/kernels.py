"""CPU kernels under the paper's model (model.py): decoding's fp32 products on oneDNN with
weights packed once (PackedWeight, PrepackedLinear), and a dropout whose masks a CPU draws
quickly. Each stands in for a torch module on a CPU alone, with its parameters and state_dict;
other devices keep torch's own kernels.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn


class PackedWeight:
    """A weight (out, in) reordered once into oneDNN's blocked layout, for fp32 inference
    products on a CPU: x (..., in) -> x W^T + b (..., out). torch's own fp32 Linear runs on MKL,
    which packs its weight again at every call, slower at the row counts of beam search
    (translator.decoding_products: where each is used). The two libraries sum in another order,
    so the products differ in their last bits. A weight changed in place (its version) or
    replaced is packed again."""

    def __init__(self) -> None:
        self.source: Optional[Tensor] = None  # the weight packed
        self.version = -1  # its version then
        self.packed: Optional[Tensor] = None

    def product(self, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        if weight is not self.source or weight._version != self.version:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
            self.source, self.version = weight, weight._version
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")

    @staticmethod
    def serves(x: Tensor) -> bool:
        """Whether x's product is one of those: fp32 on a CPU, no gradient, no autocast."""
        return (x.dtype == torch.float32 and x.device.type == "cpu" and not torch.is_grad_enabled()
                and not torch.is_autocast_enabled("cpu"))


class PrepackedLinear(nn.Linear):
    """nn.Linear whose fp32 inference products run on a PackedWeight; training, autocast (bf16)
    and other dtypes or devices keep nn.Linear's product. Decoding turns a model's nn.Linear
    modules into these in place (Transformer.prepack_products): same parameters, same
    state_dict."""

    weight_packed: Optional[PackedWeight] = None

    def forward(self, x: Tensor) -> Tensor:
        if self.weight_packed is None or not PackedWeight.serves(x):
            return super().forward(x)
        return self.weight_packed.product(x, self.weight, self.bias)


class Dropout(nn.Dropout):
    """nn.Dropout whose CPU masks come from torch's random 63-bit integers, four 15-bit draws to
    each: torch's generator there (mt19937) is serial, and its Bernoulli sampler, one draw per
    element, is a large share of a CPU update. An element is dropped where its 15 bits fall below
    round(p * 2^15): the rate is p within 2^-16, and the kept ones are scaled by 1 / (1 - p), as
    nn.Dropout does. The mask still comes from torch's generator, so seeding and resuming hold.
    Other devices keep nn.Dropout's kernel."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0 or x.device.type != "cpu":
            return super().forward(x)
        n = x.numel()
        draws = torch.empty((n + 3) // 4, dtype=torch.int64).random_()  # (ceil(n/4),) in [0, 2^63)
        bits = draws.view(torch.int16)[:n].view(x.shape).bitwise_and_(0x7FFF)  # (...) four 15-bit draws each
        keep = bits >= round(self.p * 2**15)  # (...) bool
        return x * keep.to(x.dtype).mul_(1.0 / (1.0 - self.p))  # the scaled mask: what backward multiplies by
