"""translate/model.py against independent references: torch's own Transformer layers,
the paper's formulas computed by hand, and invariances any correct implementation has."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from translate.core.choices import Init, Norm, Positions

from translate.core.config import ModelConfig
from translate.core.variants import TABLE_3
from translate.model import DecoderLayer, EncoderLayer, PositionalEncoding, Transformer

D, H, FF, N, V = 32, 4, 64, 2, 40
PAD = 0
ATOL = 1e-5


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (see conftest.one_thread)


def tiny_config(dropout: float = 0.0) -> ModelConfig:
    return ModelConfig(d_model=D, d_ff=FF, heads=H, layers=N, dropout=dropout, vocab_size=V)


def tiny_model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny_config()).eval()


def random_tokens(lengths, total: int, generator: torch.Generator) -> torch.Tensor:
    """(B, total) ids in 4..V-1, padded with PAD after each row's length."""
    tokens = torch.randint(4, V, (len(lengths), total), generator=generator)
    for row, length in enumerate(lengths):
        tokens[row, length:] = PAD
    return tokens


def perturb(module: nn.Module) -> None:
    """Non-zero biases and LayerNorms away from (1, 0), so that a mixed-up mapping shows."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif p.dim() == 1:
                p.uniform_(-0.3, 0.3)


def copy_feed_forward_and_norms(ours: nn.Module, reference: nn.Module, count: int) -> None:
    with torch.no_grad():
        reference.linear1.weight.copy_(ours.feed_forward.w_1.weight)
        reference.linear1.bias.copy_(ours.feed_forward.w_1.bias)
        reference.linear2.weight.copy_(ours.feed_forward.w_2.weight)
        reference.linear2.bias.copy_(ours.feed_forward.w_2.bias)
        for i in range(count):
            norm = getattr(reference, f"norm{i + 1}")
            norm.weight.copy_(ours.sublayer[i].norm.weight)
            norm.bias.copy_(ours.sublayer[i].norm.bias)


def copy_attention(ours, reference: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        if ours.self_attention:
            weight, bias = ours.qkv_proj.weight, ours.qkv_proj.bias
        else:  # Q from the decoder, then K and V (in that order) from the memory
            weight = torch.cat([ours.q_proj.weight, ours.kv_proj.weight])
            bias = torch.cat([ours.q_proj.bias, ours.kv_proj.bias])
        reference.in_proj_weight.copy_(weight)
        reference.in_proj_bias.copy_(bias)
        reference.out_proj.weight.copy_(ours.out_proj.weight)
        reference.out_proj.bias.copy_(ours.out_proj.bias)


def reference_layer(cls, norm: Norm = Norm.post):
    return cls(D, H, dim_feedforward=FF, dropout=0.0, activation="relu", batch_first=True, norm_first=norm == Norm.pre)


# --- layers against torch.nn ------------------------------------------------------------


@pytest.mark.parametrize("norm", [Norm.post, Norm.pre])
def test_encoder_layer_matches_torch(norm):
    """EncoderLayer == nn.TransformerEncoderLayer (ReLU; pre-norm: norm_first=True) with a
    source padding mask."""
    torch.manual_seed(0)
    ours = EncoderLayer(ModelConfig(**{**tiny_config().__dict__, "norm": norm}))
    perturb(ours)
    reference = reference_layer(nn.TransformerEncoderLayer, norm)
    copy_attention(ours.self_attn, reference.self_attn)
    copy_feed_forward_and_norms(ours, reference, 2)
    ours.eval()
    reference.eval()

    lengths = [7, 4, 1]
    x = torch.randn(3, 7, D)
    padding = torch.arange(7)[None, :] >= torch.tensor(lengths)[:, None]  # (B, S) True at padding
    with torch.no_grad():
        got = ours(x, (~padding)[:, None, None, :])
        want = reference(x, src_key_padding_mask=padding)
    real = ~padding
    assert got.shape == x.shape
    torch.testing.assert_close(got[real], want[real], atol=ATOL, rtol=0)


@pytest.mark.parametrize("norm", [Norm.post, Norm.pre])
def test_decoder_layer_matches_torch(norm):
    """DecoderLayer == nn.TransformerDecoderLayer (pre-norm: norm_first=True) with a causal
    mask and memory padding."""
    torch.manual_seed(1)
    ours = DecoderLayer(ModelConfig(**{**tiny_config().__dict__, "norm": norm}))
    perturb(ours)
    reference = reference_layer(nn.TransformerDecoderLayer, norm)
    copy_attention(ours.self_attn, reference.self_attn)
    copy_attention(ours.src_attn, reference.multihead_attn)
    copy_feed_forward_and_norms(ours, reference, 3)
    ours.eval()
    reference.eval()

    S, T = 6, 5
    x, memory = torch.randn(3, T, D), torch.randn(3, S, D)
    padding = torch.arange(S)[None, :] >= torch.tensor([6, 3, 1])[:, None]  # (B, S)
    causal = nn.Transformer.generate_square_subsequent_mask(T)
    with torch.no_grad():
        got = ours(x, memory, (~padding)[:, None, None, :])
        want = reference(x, memory, tgt_mask=causal, memory_key_padding_mask=padding, tgt_is_causal=True)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


# --- whole-model invariances ------------------------------------------------------------


def test_future_target_tokens_do_not_change_earlier_logits():
    """Decoder self-attention is causal: logits at t < k ignore target tokens at >= k."""
    model = tiny_model()
    g = torch.Generator().manual_seed(2)
    src = random_tokens([6, 4], 6, g)
    tgt = random_tokens([7, 7], 7, g)
    changed = tgt.clone()
    changed[:, 4:] = random_tokens([3, 3], 3, g) % (V - 5) + 5  # a different suffix
    assert not torch.equal(changed[:, 4:], tgt[:, 4:])
    with torch.no_grad():
        a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :4], b[:, :4], atol=ATOL, rtol=0)
    assert (a[:, 4:] - b[:, 4:]).abs().max() > 1e-3  # the later ones do change


def test_extra_padding_leaves_real_positions_unchanged():
    """More padding on source and target changes nothing at real positions."""
    model = tiny_model()
    g = torch.Generator().manual_seed(3)
    src = random_tokens([5, 3], 5, g)
    tgt = random_tokens([4, 2], 4, g)
    src_padded = torch.cat([src, torch.full((2, 6), PAD)], dim=1)
    tgt_padded = torch.cat([tgt, torch.full((2, 3), PAD)], dim=1)
    with torch.no_grad():
        plain = model(src, tgt)
        padded = model(src_padded, tgt_padded)
    torch.testing.assert_close(padded[0, :4], plain[0, :4], atol=ATOL, rtol=0)
    torch.testing.assert_close(padded[1, :2], plain[1, :2], atol=ATOL, rtol=0)
    # One sentence alone, with no padding at all, agrees with its padded row in the batch.
    with torch.no_grad():
        alone = model(src[1:, :3], tgt[1:, :2])
    torch.testing.assert_close(padded[1, :2], alone[0], atol=ATOL, rtol=0)


def test_cached_steps_equal_full_forward():
    """start_state + step (cached keys/values) == log_softmax(forward) at every position."""
    model = tiny_model()
    g = torch.Generator().manual_seed(4)
    src = random_tokens([6, 2, 4], 6, g)
    tgt = random_tokens([7, 7, 7], 7, g)
    with torch.no_grad():
        full = torch.log_softmax(model(src, tgt), dim=-1)
        state = model.start_state(src)
        for t in range(tgt.size(1)):
            torch.testing.assert_close(model.step(tgt[:, t], state), full[:, t], atol=ATOL, rtol=0)
    assert state.length == tgt.size(1)
    # The encoder-decoder keys and values are laid out once, not copied by every step's products.
    assert all(c.cross_k.is_contiguous() and c.cross_v.is_contiguous() for c in state.layers)


def test_reorder_then_step_equals_step_on_reordered_source():
    """DecoderState.reorder keeps exactly the chosen rows of every cache (with repeats)."""
    model = tiny_model()
    g = torch.Generator().manual_seed(5)
    src = random_tokens([5, 3, 4], 5, g)
    tgt = random_tokens([6, 6, 6], 6, g)
    index = torch.tensor([2, 0, 2, 1])
    with torch.no_grad():
        state = model.start_state(src)
        for t in range(3):
            model.step(tgt[:, t], state)
        state = state.reorder(index)
        assert state.length == 3
        fresh = model.start_state(src[index])
        for t in range(3):
            model.step(tgt[index, t], fresh)
        for t in range(3, 6):
            torch.testing.assert_close(
                model.step(tgt[index, t], state), model.step(tgt[index, t], fresh), atol=ATOL, rtol=0
            )


def test_reorders_between_steps_compose():
    """Reorders that follow one another with no step between (the self-attention cache moves
    its rows at the next step) keep the rows of their composition."""
    model = tiny_model()
    g = torch.Generator().manual_seed(6)
    src = random_tokens([5, 3, 4], 5, g)
    tgt = random_tokens([5, 5, 5], 5, g)
    first, second = torch.tensor([2, 0, 2, 1]), torch.tensor([3, 3, 0])
    rows = first[second]  # (3,) the source rows the hypotheses end up extending
    with torch.no_grad():
        state = model.start_state(src)
        for t in range(2):
            model.step(tgt[:, t], state)
        state = state.reorder(first).reorder(second)
        fresh = model.start_state(src[rows])
        for t in range(2):
            model.step(tgt[rows, t], fresh)
        for t in range(2, 5):
            torch.testing.assert_close(model.step(tgt[rows, t], state), model.step(tgt[rows, t], fresh), atol=ATOL, rtol=0)


# --- embeddings and positions -----------------------------------------------------------


@pytest.mark.parametrize("pos,i", [(0, 0), (1, 0), (3, 1), (17, 5), (50, 15), (999, 7)])
def test_positional_encoding_matches_paper_formula(pos, i):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(same), in float64 by hand."""
    table = PositionalEncoding(D)(length=1000)
    angle = pos / 10000 ** (2 * i / D)
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_positional_encoding_offset_and_growth():
    """An offset selects later positions, also beyond the initial table size."""
    pe = PositionalEncoding(D, max_len=4)
    rows = pe(length=3, offset=5)  # positions 5, 6, 7: past max_len
    assert rows.shape == (3, D)
    for k, pos in enumerate((5, 6, 7)):
        for i in (0, 3):
            angle = pos / 10000 ** (2 * i / D)
            assert rows[k, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert rows[k, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_embed_scales_by_sqrt_d_model_and_adds_positions():
    """embed() == sqrt(D) * E[token] + PE(pos + offset), with dropout off."""
    model = tiny_model()
    tokens = torch.tensor([[5, 9, 9], [7, 0, 3]])
    for offset in (0, 4):
        got = model.embed(tokens, offset=offset)
        for b in range(2):
            for t in range(3):
                pos = t + offset
                pe = torch.tensor(
                    [
                        math.sin(pos / 10000 ** (j / D)) if j % 2 == 0 else math.cos(pos / 10000 ** ((j - 1) / D))
                        for j in range(D)
                    ],
                    dtype=torch.float64,
                )
                want = math.sqrt(D) * model.embedding.weight[tokens[b, t]].double() + pe
                torch.testing.assert_close(got[b, t].double(), want, atol=1e-5, rtol=0)


def test_output_projection_is_the_shared_embedding():
    """logits == hidden @ E^T with E the (one) embedding matrix, and it is one tensor."""
    model = tiny_model()
    hidden = torch.randn(2, 3, D)
    torch.testing.assert_close(model.logits(hidden), hidden @ model.embedding.weight.T, atol=ATOL, rtol=0)
    model.zero_grad()
    model.logits(hidden).sum().backward()  # d(sum h E^T)/dE = sum of h, in every row
    torch.testing.assert_close(model.embedding.weight.grad, hidden.sum((0, 1)).expand(V, D), atol=ATOL, rtol=0)
    embeddings = [p for p in model.parameters() if p.shape == (V, D)]
    assert len(embeddings) == 1 and embeddings[0] is model.embedding.weight
    with torch.no_grad():  # editing the embedding moves the logits: no hidden copy
        model.embedding.weight[6].add_(1.0)
    torch.testing.assert_close(model.logits(hidden), hidden @ model.embedding.weight.T, atol=ATOL, rtol=0)


# --- sizes and initialization -----------------------------------------------------------


@pytest.mark.parametrize(
    "d_model,d_ff,heads,low,high",
    [(512, 2048, 8, 62e6, 64e6), (1024, 4096, 16, 212e6, 215.5e6)],
    ids=["base", "big"],
)
def test_parameter_counts_match_paper(d_model, d_ff, heads, low, high):
    """Base about 63M (paper: 65M), big about 213M, with a shared 37000-token vocabulary."""
    cfg = ModelConfig(d_model=d_model, d_ff=d_ff, heads=heads, layers=6, vocab_size=37000)
    with torch.device("meta"):  # counts shapes without allocating
        n = Transformer(cfg).num_parameters()
    # Exact count from the architecture: E, then per layer attention + FFN + LayerNorms.
    attention = 4 * (d_model * d_model + d_model)
    ffn = 2 * d_model * d_ff + d_ff + d_model
    exact = 37000 * d_model + 6 * (attention + ffn + 4 * d_model) + 6 * (2 * attention + ffn + 6 * d_model)
    assert n == exact
    assert low < n < high


def init_model() -> Transformer:
    torch.manual_seed(6)
    return Transformer(ModelConfig(d_model=64, d_ff=128, heads=4, layers=2, dropout=0.0, vocab_size=2000))


def test_initialization_embedding_and_biases():
    """Embeddings N(0, D^-0.5); every linear bias zero; other linears Xavier-uniform."""
    model, d = init_model(), 64
    weight = model.embedding.weight
    assert weight.mean().abs() < 0.01
    assert weight.std().item() == pytest.approx(d**-0.5, rel=0.03)
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            assert torch.count_nonzero(module.bias) == 0, name
    for linear, fan_in, fan_out in [
        (model.encoder_layers[0].feed_forward.w_1, 64, 128),
        (model.decoder_layers[1].feed_forward.w_2, 128, 64),
        (model.decoder_layers[0].self_attn.out_proj, 64, 64),
        (model.decoder_layers[0].src_attn.q_proj, 64, 64),
    ]:
        bound = math.sqrt(6 / (fan_in + fan_out))
        assert 0.95 * bound < linear.weight.abs().max().item() <= bound


def test_initialization_fused_projections_per_block():
    """Each D x D block of qkv_proj (Q, K, V) and kv_proj (K, V) has Xavier bound sqrt(6/(D+D))."""
    model, d = init_model(), 64
    bound = math.sqrt(6 / (d + d))  # one d x d matrix; the fused (3d x d) one would be sqrt(6 / 4d)
    blocks = []
    for layer in list(model.encoder_layers) + list(model.decoder_layers):
        blocks += layer.self_attn.qkv_proj.weight.split(d)
    for layer in model.decoder_layers:
        blocks += layer.src_attn.kv_proj.weight.split(d)
    assert len(blocks) == 3 * 4 + 2 * 2
    for block in blocks:
        assert 0.95 * bound < block.abs().max().item() <= bound
        assert block.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)  # uniform(-a, a)


def test_fairseq_initialization_by_hand():
    """train.init=fairseq, as fairseq 0.12.2's transformer starts: each D x D block of Q, K and
    V Xavier-uniform with gain 1/sqrt(2) and biases U(+-D^-0.5); the feed-forward layers as a
    fresh nn.Linear (weights and biases U(+-fan_in^-0.5)); out_proj as xavier (zero bias); the
    padding embedding zero, the others N(0, D^-0.5). Bounds and spreads of uniform(-a, a)."""
    torch.manual_seed(6)
    d = 64
    model = Transformer(ModelConfig(d_model=d, d_ff=128, heads=4, layers=2, dropout=0.0, vocab_size=2000), pad_id=0,
                        init=Init.fairseq)

    def uniform(tensor: torch.Tensor, bound: float, name: str) -> None:
        few = tensor.numel() < 1000  # a bias (64 or 128 draws) reaches its bound more loosely
        assert (0.8 if few else 0.95) * bound < tensor.abs().max().item() <= bound, name
        assert tensor.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.25 if few else 0.05), name

    projections = [(layer.self_attn.qkv_proj, 3) for layer in [*model.encoder_layers, *model.decoder_layers]]
    projections += [(layer.src_attn.q_proj, 1) for layer in model.decoder_layers]
    projections += [(layer.src_attn.kv_proj, 2) for layer in model.decoder_layers]
    for projection, blocks in projections:
        assert projection.weight.shape[0] == blocks * d
        for block in projection.weight.split(d):
            uniform(block, math.sqrt(6 / (d + d)) / math.sqrt(2), "Q, K or V")
        uniform(projection.bias, d**-0.5, "Q, K or V bias")
    for layer in [*model.encoder_layers, *model.decoder_layers]:
        uniform(layer.feed_forward.w_1.weight, d**-0.5, "w_1")
        uniform(layer.feed_forward.w_2.weight, 128**-0.5, "w_2")
        uniform(layer.feed_forward.w_2.bias, 128**-0.5, "w_2 bias")
        uniform(layer.self_attn.out_proj.weight, math.sqrt(6 / (d + d)), "out_proj")
        assert torch.count_nonzero(layer.self_attn.out_proj.bias) == 0
    assert torch.count_nonzero(model.embedding.weight[0]) == 0
    assert model.embedding.weight[1:].std().item() == pytest.approx(d**-0.5, rel=0.03)


def test_bad_head_count_is_refused():
    """d_model not divisible by heads: ValueError naming both numbers."""
    with pytest.raises(ValueError) as error:
        ModelConfig(d_model=500, heads=8)
    assert "500" in str(error.value) and "8" in str(error.value)


def test_grouped_state_equals_copied_rows():
    """reorder(index, group=G) (hypotheses share their sentence's encoder output), after a
    first step on one row per sentence as beam search does, gives the same log-probs step
    after step and across a beam-style reorder as copying every row G times up front."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=32, d_ff=64, heads=4, layers=2, dropout=0.0, vocab_size=40)).eval()
    src = torch.randint(4, 40, (3, 6))
    src[1, 4:] = 0
    G = 4
    with torch.no_grad():
        shared = model.start_state(src)
        first = model.step(torch.full((3,), 2), shared)  # (3, V): one row per sentence
        shared = shared.reorder(torch.arange(3).repeat_interleave(G), G)
        copied = model.start_state(src).reorder(torch.arange(3).repeat_interleave(G))
        torch.testing.assert_close(first.repeat_interleave(G, 0), model.step(torch.full((3 * G,), 2), copied), atol=1e-5, rtol=1e-5)
        tokens = torch.arange(3 * G) % 7 + 4
        for step in range(4):
            a, b = model.step(tokens, shared), model.step(tokens, copied)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
            tokens = a.argmax(-1)
            # Keep sentences 0 and 2 with their hypotheses shuffled within each sentence.
            index = torch.tensor([1, 0, 3, 3, 9, 8, 8, 10])
            if step == 1:
                shared, copied = shared.reorder(index), copied.reorder(index)
                tokens = tokens[index]
        assert shared.memory.size(0) == 2 and copied.memory.size(0) == 8


def test_padded_vocabulary_equals_unpadded_and_never_predicts_padding():
    """vocab_multiple pads the embedding's rows (an aligned projection width) without changing
    the model: same logits as the unpadded model, V columns, no gradient into padding rows."""
    V_odd = 37
    padded_cfg = ModelConfig(d_model=D, d_ff=FF, heads=H, layers=N, dropout=0.0, vocab_size=V_odd, vocab_multiple=8)
    plain_cfg = ModelConfig(d_model=D, d_ff=FF, heads=H, layers=N, dropout=0.0, vocab_size=V_odd, vocab_multiple=1)
    torch.manual_seed(0)
    padded = Transformer(padded_cfg)
    plain = Transformer(plain_cfg)
    assert padded.embedding.weight.shape == (40, D) and plain.embedding.weight.shape == (V_odd, D)
    state = padded.state_dict()
    state["embedding.weight"] = state["embedding.weight"][:V_odd]
    plain.load_state_dict(state)
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, V_odd, (3, 6), generator=g)
    tgt = torch.randint(4, V_odd, (3, 5), generator=g)
    logits = padded(src, tgt)
    assert logits.shape == (3, 5, V_odd)
    torch.testing.assert_close(logits, plain(src, tgt), atol=ATOL, rtol=0)
    logits.logsumexp(-1).sum().backward()
    grad = padded.embedding.weight.grad
    assert grad[V_odd:].abs().max() == 0 and grad[:V_odd].abs().max() > 0
    with torch.no_grad():
        state_ = padded.start_state(src)
        assert padded.step(tgt[:, 0], state_).shape == (3, V_odd)


def test_checkpoints_from_before_padding_load_unpadded():
    from translate.checkpoint import Checkpoint

    cfg = Checkpoint({}, {"d_model": D, "d_ff": FF, "heads": H, "layers": N, "vocab_size": 37}, b"", 0).model_config()
    assert cfg.vocab_multiple == 1 and cfg.padded_vocab_size == 37


# --- Table 3's variants and pre-norm -------------------------------------------------------


@pytest.mark.parametrize("row", [name for name, variant in TABLE_3.items() if variant.paper_params])
def test_parameter_counts_of_table_3_rows(row, compose):
    """Every row, composed from its command-line overrides of config=base, within 3% of the
    paper's count, with one vocabulary for all: 40.7k, where base's 65M fits (the paper's
    "about 37000" and rounded counts; at 37k row B falls outside)."""
    variant = TABLE_3[row]
    model_cfg = replace(compose("train", "config=base", *variant.overrides).model, vocab_size=40700)
    with torch.device("meta"):
        n = Transformer(model_cfg).num_parameters()
    assert n == pytest.approx(variant.paper_params * 1e6, rel=0.03)


def test_table_3_rows_widths_per_head():
    """Row A keeps d_k = d_v = d_model / h, row C's widths keep 8 heads of d_model / 8, row B
    sets d_k alone (d_v stays 64): the rule ModelConfig applies to the overrides."""
    widths = {name: ModelConfig(**{key.split(".")[1]: int(value) for key, value in (o.split("=") for o in v.overrides)})
              for name, v in TABLE_3.items() if v.row in "ABC" and v.row}
    assert [(widths[f"A h={h}"].key_width, widths[f"A h={h}"].value_width) for h in (1, 4, 16, 32)] == [
        (512, 512), (128, 128), (32, 32), (16, 16)]
    assert (widths["B d_k=16"].key_width, widths["B d_k=16"].value_width) == (16, 64)
    assert widths["C d_model=256"].key_width == 32 and widths["C d_model=1024"].key_width == 128


def pre_norm_config(**overrides) -> ModelConfig:
    return ModelConfig(**{**tiny_config().__dict__, "norm": Norm.pre, **overrides})


@pytest.mark.parametrize("overrides", [
    dict(norm=Norm.pre),  # the final LayerNorms too
    dict(d_k=4, d_v=12),  # row B's shape: per-head widths apart from D / H and from each other
    dict(positions=Positions.learned, max_positions=16),
], ids=["pre-norm", "d_k-d_v", "learned"])
def test_variants_cached_steps_equal_full_forward(overrides):
    torch.manual_seed(9)
    model = Transformer(ModelConfig(**{**tiny_config().__dict__, **overrides})).eval()
    perturb(model)
    g = torch.Generator().manual_seed(4)
    src, tgt = random_tokens([6, 2, 4], 6, g), random_tokens([7, 7, 7], 7, g)
    with torch.no_grad():
        full = torch.log_softmax(model(src, tgt), dim=-1)
        state = model.start_state(src)
        for t in range(tgt.size(1)):
            torch.testing.assert_close(model.step(tgt[:, t], state), full[:, t], atol=ATOL, rtol=0)


def test_pre_norm_ends_each_stack_in_a_layer_norm():
    """The decoder's output is LayerNorm(last layer's output): changing decoder_norm's gain
    scales the hidden states exactly (and a post-norm model has no such module)."""
    torch.manual_seed(10)
    model = Transformer(pre_norm_config()).eval()
    g = torch.Generator().manual_seed(5)
    src, tgt = random_tokens([5, 3], 5, g), random_tokens([4, 4], 4, g)
    with torch.no_grad():
        memory, mask = model.encode(src)
        before = model.decoder_states(tgt, memory, mask)
        model.decoder_norm.weight.mul_(2.0)
        after = model.decoder_states(tgt, memory, mask)
    torch.testing.assert_close(after, 2 * before, atol=ATOL, rtol=0)
    assert not hasattr(tiny_model(), "decoder_norm")


def test_learned_positions_are_refused_past_their_table():
    model = Transformer(ModelConfig(**{**tiny_config().__dict__, "positions": Positions.learned, "max_positions": 5}))
    with pytest.raises(ValueError, match="past the learned table's 5 rows"):
        model.embed(torch.ones(1, 6, dtype=torch.long))


# --- decoding's prepacked products ---------------------------------------------------------


def prepacked_pair(seed: int = 0):
    """Two copies of one small random model (perturbed biases and norms), the second with
    every product prepacked (Transformer.prepack_products)."""
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, d_ff=64, heads=4, layers=2, dropout=0.0, vocab_size=40)
    plain = Transformer(cfg).eval()
    perturb(plain)
    packed = Transformer(cfg).eval()
    packed.load_state_dict(plain.state_dict())
    packed.prepack_products(output=True, layers=True)
    return plain, packed


def test_prepacked_steps_equal_torchs_products():
    """Incremental decoding on oneDNN's prepacked products (the new path) gives the log-probs
    of torch's own products (the old path) step after step, across a beam-style reorder, to
    fp32's rounding (the libraries sum in another order); the model keeps its parameters and
    state_dict. Without prepack_products no product is a PrepackedLinear."""
    from translate.kernels import PrepackedLinear

    plain, packed = prepacked_pair()
    assert not any(isinstance(m, PrepackedLinear) for m in plain.modules())
    linears = [m for m in packed.modules() if isinstance(m, nn.Linear)]
    assert linears and all(isinstance(m, PrepackedLinear) for m in linears)
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), packed.state_dict().values()))
    g = torch.Generator().manual_seed(7)
    src = random_tokens([6, 2, 4], 6, g)
    tokens = torch.randint(4, V, (3, 6), generator=g)
    with torch.inference_mode():
        a, b = plain.start_state(src), packed.start_state(src)
        for t in range(6):
            want, got = plain.step(tokens[:, t], a), packed.step(tokens[:, t], b)
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
            if t == 2:
                index = torch.tensor([2, 2, 0])
                a, b, tokens = a.reorder(index), b.reorder(index), tokens[index]
    assert packed.output_packed.packed is not None  # the new path ran: the weights were packed
    assert all(m.weight_packed.packed is not None for m in packed.decoder_layers.modules() if isinstance(m, PrepackedLinear))


def test_prepacked_products_serve_fp32_inference_only():
    """Training (gradients), bf16 autocast and other dtypes run torch's own products, bit for
    bit; a weight changed in place is packed again."""
    import torch.nn.functional as F

    plain, packed = prepacked_pair(seed=1)
    src, tgt = random_tokens([5, 3], 5, torch.Generator().manual_seed(8)), torch.randint(4, V, (2, 4))
    assert torch.equal(packed(src, tgt), plain(src, tgt))  # gradients enabled: nn.Linear's product
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(packed(src, tgt), plain(src, tgt))
    linear = packed.decoder_layers[0].feed_forward.w_1
    x = torch.randn(5, 32)
    with torch.inference_mode():
        torch.testing.assert_close(linear(x), F.linear(x, linear.weight, linear.bias), atol=ATOL, rtol=0)
    with torch.no_grad():
        linear.weight.mul_(2)
    with torch.inference_mode():
        torch.testing.assert_close(linear(x), F.linear(x, linear.weight, linear.bias), atol=2 * ATOL, rtol=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prepacked_beam_search_finds_torchs_outputs(seed):
    """Beam search (beam 4) and greedy search on the prepacked model give the tokens of the
    model on torch's products."""
    from translate.core.config import DecodeConfig
    from translate.search import Symbols, beam_search

    plain, packed = prepacked_pair(seed)
    src = random_tokens([7, 4, 6, 2], 7, torch.Generator().manual_seed(seed))
    symbols = Symbols(bos=1, eos=2, banned=(0, 3))
    for beam in (4, 1):
        settings = DecodeConfig(beam_size=beam, length_penalty=0.6)
        with torch.inference_mode():
            want = beam_search(plain.step, plain.start_state(src), [9, 6, 8, 4], settings, symbols)
            got = beam_search(packed.step, packed.start_state(src), [9, 6, 8, 4], settings, symbols)
        assert [[h.tokens for h in hs] for hs in got] == [[h.tokens for h in hs] for hs in want]
