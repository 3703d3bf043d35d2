"""Multi-head scaled dot-product attention (paper, section 3.2) and the keys and values one
decoder layer caches for incremental decoding.

Shapes: B batch, T query positions, S (or L) key positions, D d_model, H heads, K = d_k
(query and key width per head), Kv = d_v (value width per head).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention (section 3.2.2), on torch's fused kernel.

    Self-attention projects Q, K, V with one matrix; encoder-decoder attention projects Q
    from the decoder and K, V (once per sentence when decoding) from the encoder output.
    Each head's queries and keys are d_k wide, its values d_v (Table 3, rows A and B).
    """

    def __init__(self, d_model: int, heads: int, *, self_attention: bool, d_k: int, d_v: int):
        super().__init__()
        self.heads = heads
        self.self_attention = self_attention
        self.d_k, self.d_v = d_k, d_v  # ModelConfig.key_width and value_width
        # The widths of the fused projection's blocks: Q, K, V (self-attention) or K, V.
        self.widths = [heads * self.d_k] * (2 if self_attention else 1) + [heads * self.d_v]
        if self_attention:
            self.qkv_proj = nn.Linear(d_model, sum(self.widths))
        else:
            self.q_proj = nn.Linear(d_model, heads * self.d_k)
            self.kv_proj = nn.Linear(d_model, sum(self.widths))
        self.out_proj = nn.Linear(heads * self.d_v, d_model)

    def split_heads(self, x: Tensor) -> Tensor:
        B, L, W = x.shape
        return x.view(B, L, self.heads, W // self.heads).transpose(1, 2)  # (B, H, L, K or Kv)

    def project(self, x: Tensor, memory: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
        """Queries (B, H, T, K), keys (B, H, L, K) and values (B, H, L, Kv): of x itself for
        self-attention (L = T), of the encoder output for encoder-decoder attention (L = S)."""
        if self.self_attention:
            q, k, v = (self.split_heads(t) for t in self.qkv_proj(x).split(self.widths, dim=-1))
            return q, k, v
        return (self.split_heads(self.q_proj(x)), *self.project_kv(memory))

    def project_kv(self, memory: Tensor) -> Tuple[Tensor, Tensor]:
        """Keys and values of the encoder output: (B, H, S, K) and (B, H, S, Kv)."""
        k, v = self.kv_proj(memory).split(self.widths, dim=-1)
        return self.split_heads(k), self.split_heads(v)

    def forward(
        self,
        x: Tensor,  # (B, T, D) queries (and keys/values for self-attention)
        memory: Optional[Tensor] = None,  # (B, S, D) encoder output, for encoder-decoder attention
        mask: Optional[Tensor] = None,  # (B, 1, 1 or T, S) True where attention is allowed
        causal: bool = False,  # mask future positions (decoder self-attention, training)
        cache: Optional["LayerCache"] = None,  # incremental decoding state of this layer
    ) -> Tensor:
        B, T, _ = x.shape
        H, K, Kv = self.heads, self.d_k, self.d_v
        if self.self_attention:
            q, k, v = self.project(x)  # (B, H, T, K or Kv)
            if cache is not None:  # append this step's keys and values to the earlier ones
                k, v = cache.append(k, v)  # (B, H, t, K or Kv)
        else:
            q = self.split_heads(self.q_proj(x))  # (B, H, T, K)
            if cache is not None:
                if cache.cross_k is None:
                    # Contiguous once: as views of the fused projection, every step's products
                    # copied them (torch's bmm takes only contiguous batches).
                    cache.cross_k, cache.cross_v = (t.contiguous() for t in self.project_kv(memory))
                k, v = cache.cross_k, cache.cross_v  # (B / G, H, S, K): one row per source sentence
                if cache.group > 1:
                    # The G hypotheses of a sentence attend to the same source: attend as G
                    # query positions of that sentence instead of copying its keys G times.
                    G = cache.group
                    q = q.view(B // G, G, H, T, K).transpose(1, 2)  # (B/G, H, G, T, K)
                    q = q.reshape(B // G, H, G * T, K)  # (B/G, H, G*T, K)
                    out = attend_few(q, k, v, mask)  # (B/G, H, G*T, Kv)
                    out = out.view(B // G, H, G, T, Kv).permute(0, 2, 3, 1, 4)  # (B/G, G, T, H, Kv)
                    return self.out_proj(out.reshape(B, T, H * Kv))
            else:
                k, v = self.project_kv(memory)  # (B, H, S, K)
        if cache is not None:  # incremental decoding: one query position per row
            out = attend_few(q, k, v, mask)
        else:
            out = attend(q, k, v, mask, causal=causal)  # (B, H, T, Kv)
        out = out.transpose(1, 2).reshape(B, T, H * Kv)  # (B, T, H * Kv)
        return self.out_proj(out)  # (B, T, D)


def attention_probabilities(q: Tensor, k: Tensor, mask: Optional[Tensor]) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)): q (B, H, T, K), k (B, H, S, K), mask broadcastable to
    (B, H, T, S), True where allowed -> (B, H, T, S)."""
    scores = (q @ k.transpose(-1, -2)) * q.size(-1) ** -0.5  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1, dtype=torch.float32)  # fp32 also where q and k are bf16


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], *, causal: bool) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V over whole sequences (training, encoding): q (B, H, T, K),
    k (B, H, S, K), v (B, H, S, Kv), mask broadcastable to (B, H, T, S) True where allowed,
    or causal -> (B, H, T, Kv). torch's fused kernel, except in bf16 on CPUs: there its
    backward is slower than fp32's, while the products written out run on the CPU's bf16 units
    (AMX, AVX512-BF16) and the softmax stays in fp32."""
    if q.dtype != torch.bfloat16 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)
    weights = attention_probabilities(q, k, causal_mask(q, k) if causal and mask is None else mask)
    return weights.to(v.dtype) @ v  # (B, H, T, Kv)


def causal_mask(q: Tensor, k: Tensor) -> Tensor:
    """(T, S) True on and below the diagonal: each query position sees itself and the keys before it."""
    return torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()


def attend_few(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor]) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V written out, for the few query positions of incremental
    decoding: q (B, H, T, K), k (B, H, S, K), v (B, H, S, Kv), mask (B, 1, 1, S) True where allowed.
    On CPUs this beats the fused kernel at these small shapes, and computes the same."""
    return attention_probabilities(q, k, mask).to(v.dtype) @ v  # (B, H, T, Kv)


@dataclass
class LayerCache:
    """One decoder layer's keys and values: self-attention (B, H, length, K) per hypothesis,
    encoder-decoder attention (B / group, H, S, K) per source sentence.

    Beam search's reorder of the self-attention cache waits for the next append, which copies
    the rows kept and the new position into one fresh tensor: one copy of the cache per step,
    where reordering (index_select) and then appending (cat) would make two."""

    self_k: Optional[Tensor] = None  # (B_prev, H, length, K): rows before `pending` applies
    self_v: Optional[Tensor] = None  # (B_prev, H, length, Kv)
    cross_k: Optional[Tensor] = None
    cross_v: Optional[Tensor] = None
    group: int = 1  # hypotheses per source sentence (beam size)
    pending: Optional[Tensor] = None  # (B,) rows of self_k and self_v that the hypotheses extend

    def append(self, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
        """Add T positions, k (B, H, T, K) and v (B, H, T, Kv); returns every position so far,
        (B, H, length + T, K) and (B, H, length + T, Kv)."""
        if self.self_k is None:
            self.self_k, self.self_v = k, v
        else:
            self.self_k, self.self_v = (self._extended(old, new) for old, new in ((self.self_k, k), (self.self_v, v)))
        self.pending = None
        return self.self_k, self.self_v

    def _extended(self, old: Tensor, new: Tensor) -> Tensor:
        length = old.size(2)
        out = new.new_empty((new.size(0), new.size(1), length + new.size(2), new.size(3)))  # (B, H, length + T, W)
        if self.pending is None:
            out[:, :, :length] = old
        else:
            torch.index_select(old, 0, self.pending, out=out[:, :, :length])
        out[:, :, length:] = new
        return out

    def reorder(self, index: Tensor, cross: Callable[[Optional[Tensor]], Optional[Tensor]], group: int) -> "LayerCache":
        """The hypotheses `index` (B',) of these; cross() picks the per-sentence rows of the
        encoder-decoder cache. The self-attention rows move at the next append."""
        if self.self_k is None:  # nothing cached yet: nothing to move
            pending = None
        else:  # rows of rows, when no step came between two reorders
            pending = index if self.pending is None else self.pending.index_select(0, index)
        return LayerCache(self_k=self.self_k, self_v=self.self_v, cross_k=cross(self.cross_k), cross_v=cross(self.cross_v),
                          group=group, pending=pending)
