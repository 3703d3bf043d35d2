"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017): post-norm, and the
variants of its Table 3 (per-head widths, learned positions) and pre-norm.

Class names follow the paper (MultiHeadAttention, in attention.py with its decoding cache);
the CPU kernels it runs on (a dropout, decoding's prepacked products) are in kernels.py.
Nothing here knows of Hydra, files or distributed training.
Shapes: B batch, S source length, T target length, D d_model, H heads, K = d_k (query and key
width per head, D / H by default), Kv = d_v (value width per head), V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from translate.attention import LayerCache, MultiHeadAttention
from translate.core.choices import Init, Norm, Positions
from translate.core.config import ModelConfig
from translate.kernels import Dropout, PackedWeight, PrepackedLinear


class PositionalEncoding(nn.Module):
    """Sinusoidal positions (section 3.5): PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...)."""

    def __init__(self, d_model: int, *, max_len: int = 1024):
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", self._table(max_len), persistent=False)

    def _table(self, max_len: int) -> Tensor:
        position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (L, 1)
        frequency = torch.exp(torch.arange(0, self.d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / self.d_model))
        table = torch.zeros(max_len, self.d_model, dtype=torch.float64)
        table[:, 0::2] = torch.sin(position * frequency)
        table[:, 1::2] = torch.cos(position * frequency)
        return table.float()  # (L, D)

    def forward(self, length: int, *, offset: int = 0) -> Tensor:
        """(length, D) encodings of positions offset .. offset + length - 1."""
        if offset + length > self.table.size(0):  # grow for long inputs instead of failing
            self.table = self._table(2 * (offset + length)).to(self.table.device)
        return self.table[offset : offset + length]


class LearnedPositions(nn.Module):
    """A learned embedding for each position up to max_positions (Table 3, row E)."""

    def __init__(self, d_model: int, max_positions: int):
        super().__init__()
        if max_positions < 1:
            raise ValueError(f"learned positions need max_positions ({max_positions}) of at least 1")
        self.table = nn.Embedding(max_positions, d_model)

    def forward(self, length: int, *, offset: int = 0) -> Tensor:
        """(length, D) embeddings of positions offset .. offset + length - 1."""
        if offset + length > self.table.num_embeddings:
            raise ValueError(f"position {offset + length - 1} is past the learned table's {self.table.num_embeddings} rows")
        return self.table.weight[offset : offset + length]


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (section 3.3)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(F.relu(self.w_1(x)))


class SublayerConnection(nn.Module):
    """The residual around each sub-layer. Post-norm (the paper, sections 3.1 and 5.4):
    LayerNorm(x + Dropout(Sublayer(x))); pre-norm: x + Dropout(Sublayer(LayerNorm(x)))."""

    def __init__(self, d_model: int, dropout: float, norm: Norm = Norm.post):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = norm == Norm.pre

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention, then feed-forward (Figure 1, left)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.heads, self_attention=True, d_k=cfg.key_width,
                                            d_v=cfg.value_width)
        self.feed_forward = PositionwiseFeedForward(cfg.d_model, cfg.d_ff)
        self.sublayer = nn.ModuleList([SublayerConnection(cfg.d_model, cfg.dropout, cfg.norm) for _ in range(2)])

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        x = self.sublayer[0](x, lambda y: self.self_attn(y, mask=src_mask))
        return self.sublayer[1](x, self.feed_forward)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward (Figure 1, right)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.heads, self_attention=True, d_k=cfg.key_width,
                                            d_v=cfg.value_width)
        self.src_attn = MultiHeadAttention(cfg.d_model, cfg.heads, self_attention=False, d_k=cfg.key_width,
                                           d_v=cfg.value_width)
        self.feed_forward = PositionwiseFeedForward(cfg.d_model, cfg.d_ff)
        self.sublayer = nn.ModuleList([SublayerConnection(cfg.d_model, cfg.dropout, cfg.norm) for _ in range(3)])

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor, cache: Optional["LayerCache"] = None) -> Tensor:
        # With a cache, x holds only new positions and may attend to every cached one.
        x = self.sublayer[0](x, lambda y: self.self_attn(y, causal=cache is None, cache=cache))
        x = self.sublayer[1](x, lambda y: self.src_attn(y, memory=memory, mask=src_mask, cache=cache))
        return self.sublayer[2](x, self.feed_forward)


@dataclass
class DecoderState:
    """Everything incremental decoding carries from one step to the next."""

    memory: Tensor  # (B, S, D) encoder output
    src_mask: Tensor  # (B, 1, 1, S) True at real source tokens
    layers: List[LayerCache] = field(default_factory=list)
    length: int = 0  # target positions decoded so far

    group: int = 1  # hypotheses (rows) per source sentence; memory has one row per sentence

    def reorder(self, index: Tensor, group: Optional[int] = None) -> "DecoderState":
        """Keep rows `index` (B',) of every tensor: beam search's reordering of hypotheses.

        `group`: hypotheses (rows) per sentence after this reorder (default: as before); they
        share their sentence's encoder output instead of copying it. With a group, each
        consecutive run of `group` entries of index must come from one sentence (as in beam
        search), and the per-sentence tensors follow those sentences.
        """
        group = group or self.group
        pick = lambda t, i: None if t is None else t.index_select(0, i)  # noqa: E731
        sentences = index if group == 1 else index.view(-1, group)[:, 0] // self.group  # (B' / group,)
        if group > 1 and len(sentences) == len(self.memory):  # no sentence left: nothing to move
            sentences = None
        per_sentence = (lambda t: t) if sentences is None else (lambda t: pick(t, sentences))  # noqa: E731
        layers = [c.reorder(index, per_sentence, group) for c in self.layers]
        return DecoderState(per_sentence(self.memory), per_sentence(self.src_mask), layers, length=self.length,
                            group=group)


class Transformer(nn.Module):
    """Encoder-decoder with one embedding matrix shared by source, target and the pre-softmax
    projection (section 3.4), scaled by sqrt(d_model)."""

    output_packed: Optional[PackedWeight] = None  # decoding's prepacked output projection (prepack_products)

    def __init__(self, cfg: ModelConfig, pad_id: int = 0, init: Init = Init.xavier):
        super().__init__()
        if cfg.vocab_size <= 0:
            raise ValueError(f"vocab_size ({cfg.vocab_size}) must be positive")
        self.cfg = cfg
        self.pad_id = pad_id
        self.embedding = nn.Embedding(cfg.padded_vocab_size, cfg.d_model)  # rows past vocab_size: padding
        if cfg.positions == Positions.learned:
            self.positional_encoding: nn.Module = LearnedPositions(cfg.d_model, cfg.max_positions)
        else:
            self.positional_encoding = PositionalEncoding(cfg.d_model)
        self.dropout = Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList([EncoderLayer(cfg) for _ in range(cfg.layers)])
        self.decoder_layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.layers)])
        if cfg.norm == Norm.pre:  # pre-norm's stacks end in a LayerNorm of their own
            self.encoder_norm, self.decoder_norm = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.reset_parameters(init)

    def reset_parameters(self, init: Init = Init.xavier) -> None:
        """The paper does not say. xavier, as tensor2tensor: embeddings (and learned positions)
        N(0, D^-0.5), Xavier-uniform projections (Q, K and V each as its own matrix), zero
        biases. fairseq, as fairseq 0.12.2: the same, but Q, K and V with gain 1/sqrt(2) and
        torch's default biases U(+-D^-0.5), the feed-forward layers torch's default nn.Linear
        init (weights and biases U(+-fan_in^-0.5)), and the padding embedding zero."""
        nn.init.normal_(self.embedding.weight, mean=0.0, std=self.cfg.d_model**-0.5)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        for module in self.modules():  # after the pass above, which would overwrite this one
            if isinstance(module, MultiHeadAttention):  # fused projections: one init per matrix
                fused = module.qkv_proj if module.self_attention else module.kv_proj
                for block in fused.weight.split(module.widths, dim=0):
                    nn.init.xavier_uniform_(block)
        if init == Init.fairseq:
            self._fairseq_init()
        if isinstance(self.positional_encoding, LearnedPositions):
            nn.init.normal_(self.positional_encoding.table.weight, mean=0.0, std=self.cfg.d_model**-0.5)

    @torch.no_grad()
    def _fairseq_init(self) -> None:
        """What fairseq 0.12.2's transformer changes of the xavier init (reset_parameters)."""
        gain = 2**-0.5
        for module in self.modules():
            if isinstance(module, PositionwiseFeedForward):
                module.w_1.reset_parameters()  # nn.Linear's own: U(+-fan_in^-0.5), weights and biases
                module.w_2.reset_parameters()
            elif isinstance(module, MultiHeadAttention):
                if module.self_attention:
                    projections = [(module.qkv_proj, module.widths)]
                else:
                    projections = [(module.q_proj, [module.q_proj.out_features]), (module.kv_proj, module.widths)]
                for projection, widths in projections:  # each of Q, K and V its own matrix, as fairseq's
                    for block in projection.weight.split(widths, dim=0):
                        nn.init.xavier_uniform_(block, gain=gain)
                    bound = projection.in_features**-0.5
                    nn.init.uniform_(projection.bias, -bound, bound)
        self.embedding.weight[self.pad_id].zero_()

    def embed(self, tokens: Tensor, offset: int = 0) -> Tensor:
        """Dropout(sqrt(D) * E[tokens] + PE): (B, L) -> (B, L, D)."""
        x = self.embedding(tokens) * math.sqrt(self.cfg.d_model)
        return self.dropout(x + self.positional_encoding(tokens.size(1), offset=offset))

    def encode(self, src: Tensor) -> Tuple[Tensor, Tensor]:
        """(B, S) source ids -> memory (B, S, D) and src_mask (B, 1, 1, S), True at real tokens."""
        src_mask = (src != self.pad_id)[:, None, None, :]
        x = self.embed(src)
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        return self.final_norm(x, self.encoder_norm if self.cfg.norm == Norm.pre else None), src_mask

    def decoder_states(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Teacher forcing: (B, T) target input -> (B, T, D) final decoder states."""
        x = self.embed(tgt_in)
        for layer in self.decoder_layers:
            x = layer(x, memory, src_mask)
        return self.final_norm(x, self.decoder_norm if self.cfg.norm == Norm.pre else None)

    @staticmethod
    def final_norm(x: Tensor, norm: Optional[nn.LayerNorm]) -> Tensor:
        """A pre-norm stack's last LayerNorm (a post-norm one ends normalized already)."""
        return x if norm is None else norm(x)

    def logits(self, hidden: Tensor) -> Tensor:
        """Pre-softmax projection with the shared embedding: (..., D) -> (..., V).

        The product runs over the padded rows too (an aligned output width); the padding
        columns are cut off, so they are never predicted and get no gradient. Decoding's fp32
        products run on the prepacked weight where prepack_products asked for it."""
        packed = self.output_packed
        if packed is not None and PackedWeight.serves(hidden):
            logits = packed.product(hidden, self.embedding.weight, None)  # (..., padded V)
        else:
            logits = F.linear(hidden, self.embedding.weight)  # (..., padded V)
        V = self.cfg.vocab_size
        return logits if logits.size(-1) == V else logits[..., :V]

    def forward(self, src: Tensor, tgt_in: Tensor, select: Optional[Tensor] = None) -> Tensor:
        """(B, S), (B, T) -> logits (B, T, V). With select, (N,) flat positions in (B*T,)
        (Batch.real_targets), logits (N, V) at those positions only (training: padding costs no
        vocabulary projection; unlike a boolean mask, positions do not make a GPU wait to learn N)."""
        if select is None:
            memory, src_mask = self.encode(src)
            return self.logits(self.decoder_states(tgt_in, memory, src_mask))
        return self.logits(self.selected_states(src, tgt_in, select))  # (N, V)

    def selected_states(self, src: Tensor, tgt_in: Tensor, select: Tensor) -> Tensor:
        """(B, S), (B, T), (N,) flat positions in (B*T,) -> the final decoder states (N, D) there."""
        memory, src_mask = self.encode(src)
        hidden = self.decoder_states(tgt_in, memory, src_mask)  # (B, T, D)
        return hidden.flatten(0, 1).index_select(0, select)  # (N, D)

    def output_weight(self) -> Tensor:
        """The pre-softmax projection's weight (V, D): the shared embedding's real rows."""
        weight = self.embedding.weight
        return weight if weight.size(0) == self.cfg.vocab_size else weight[: self.cfg.vocab_size]

    def start_state(self, src: Tensor) -> DecoderState:
        """Encode the source and set up empty caches for step()."""
        memory, src_mask = self.encode(src)
        return DecoderState(memory, src_mask, [LayerCache() for _ in self.decoder_layers])

    def step(self, tokens: Tensor, state: DecoderState) -> Tensor:
        """One decoding step with cached keys and values: (B,) last tokens -> (B, V) log-probs.

        Updates state in place; equals the last position of decoder_states() on the whole prefix.
        """
        x = self.embed(tokens[:, None], offset=state.length)  # (B, 1, D)
        for layer, cache in zip(self.decoder_layers, state.layers):
            x = layer(x, state.memory, state.src_mask, cache=cache)
        x = self.final_norm(x, self.decoder_norm if self.cfg.norm == Norm.pre else None)
        state.length += 1
        return F.log_softmax(self.logits(x[:, 0]).float(), dim=-1)

    def prepack_products(self, *, output: bool, layers: bool) -> None:
        """Decoding's fp32 products on oneDNN with prepacked weights (PackedWeight): the output
        projection's, and the layers' (the encoder's and the decoder's: their nn.Linear modules
        become PrepackedLinear, in place). Neither changes the parameters, the state_dict or
        training; see translator.decoding_products for which a CPU gets."""
        self.output_packed = PackedWeight() if output else None
        for module in [*self.encoder_layers.modules(), *self.decoder_layers.modules()]:
            if layers and type(module) is nn.Linear:
                module.__class__ = PrepackedLinear
            if isinstance(module, PrepackedLinear):
                module.weight_packed = PackedWeight() if layers else None

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
