"""The attention probabilities of a Transformer's pass, for figures (the paper's Figures 3-5):
torch's fused attention kernel never materializes them, so they are computed again from each
MultiHeadAttention's own inputs, which forward hooks hand over for one call. No training or
decoding path uses this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import List, Optional

import torch
from torch import Tensor

from translate.attention import MultiHeadAttention, attention_probabilities, causal_mask
from translate.model import Transformer


@dataclass
class AttentionMaps:
    """Every layer's attention probabilities for one teacher-forced pass, first layer first."""

    encoder: List[Tensor] = field(default_factory=list)  # encoder self-attention, (B, H, S, S) each
    decoder: List[Tensor] = field(default_factory=list)  # decoder (masked) self-attention, (B, H, T, T)
    cross: List[Tensor] = field(default_factory=list)  # encoder-decoder attention, (B, H, T, S)


def probabilities(attention: MultiHeadAttention, x: Tensor, memory: Optional[Tensor] = None,
                  mask: Optional[Tensor] = None, causal: bool = False) -> Tensor:
    """Each head's softmax(Q K^T / sqrt(d_k)), (B, H, T, L), for the inputs of an attention's
    forward() without cache: the weights it applies to the values."""
    q, k, _ = attention.project(x, memory)
    return attention_probabilities(q, k, causal_mask(q, k) if causal and mask is None else mask)


@torch.no_grad()
def attention_maps(model: Transformer, src: Tensor, tgt_in: Tensor) -> AttentionMaps:
    """The attention probabilities of the model's encode() and decoder_states() on (B, S),
    (B, T): forward hooks, there only for this call, give each MultiHeadAttention's own inputs
    to probabilities(), so that the passes themselves run unchanged."""
    maps = AttentionMaps()
    stores = [(layer.self_attn, maps.encoder) for layer in model.encoder_layers]
    stores += [(attn, store) for layer in model.decoder_layers
               for attn, store in ((layer.self_attn, maps.decoder), (layer.src_attn, maps.cross))]

    def keep(store: List[Tensor], module: MultiHeadAttention, args: tuple, kwargs: dict, output: Tensor) -> None:
        inputs = {key: kwargs[key] for key in ("memory", "mask", "causal") if key in kwargs}
        store.append(probabilities(module, *args, **inputs))

    hooks = [attn.register_forward_hook(partial(keep, store), with_kwargs=True) for attn, store in stores]
    try:
        memory, src_mask = model.encode(src)
        model.decoder_states(tgt_in, memory, src_mask)
    finally:
        for hook in hooks:
            hook.remove()
    return maps
