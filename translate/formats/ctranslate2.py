"""A checkpoint as a CTranslate2 model folder, and translation with one.

Every weight is set by hand on CTranslate2's Transformer spec (post-norm or pre-norm, ReLU),
with our own position table: CTranslate2's built-in sinusoid puts all sines before all
cosines, ours interleaves them. The folder also holds the sentencepiece model, so it is
self-contained.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

import numpy as np

from translate.core.choices import Norm, Positions

from translate.core.config import DecodeConfig
from translate.core.errors import TranslateError
from translate.core.paths import EXPORT_MARKER
from translate.data.vocabulary import SpecialIds, Vocabulary
from translate.translator import Decoding

SENTENCEPIECE = "sentencepiece.model"
POSITIONS = 2048  # rows of the exported position table at least: CTranslate2 cannot grow it as we do


def positions(decode: DecodeConfig) -> int:
    """Rows of the exported sinusoid table: what decode.max_source_length and its output cap need."""
    return max(POSITIONS, decode.positions())


def write_ctranslate2(translator, folder: Path, decoding: Decoding) -> None:
    """Fill CTranslate2's TransformerSpec from our model and save it into `folder`, with a
    README.md that states the decode settings to translate with (`decoding`)."""
    try:
        import ctranslate2.specs as specs
    except ImportError:
        raise TranslateError("export.format=ctranslate2 needs the ctranslate2 package (pip install ctranslate2)") from None

    model, cfg = translator.model, translator.model.cfg
    if cfg.key_width * cfg.heads != cfg.d_model or cfg.value_width * cfg.heads != cfg.d_model:
        raise TranslateError(f"export.format=ctranslate2 cannot express model.d_k={cfg.key_width} and model.d_v="
                             f"{cfg.value_width} with {cfg.heads} heads of d_model {cfg.d_model}: its attention splits "
                             "d_model evenly among the heads")
    weights = {name: tensor.detach().float().cpu().numpy() for name, tensor in model.state_dict().items()}
    spec = specs.TransformerSpec.from_config(
        cfg.layers, cfg.heads, pre_norm=cfg.norm == Norm.pre, activation=specs.Activation.RELU
    )
    _fill_embeddings(spec, weights, cfg, positions(decoding.settings))
    _fill_layers(spec, weights)
    if cfg.norm == Norm.pre:  # the final LayerNorm of each stack
        for stack, name in ((spec.encoder, "encoder_norm"), (spec.decoder, "decoder_norm")):
            stack.layer_norm.gamma, stack.layer_norm.beta = weights[f"{name}.weight"], weights[f"{name}.bias"]
    _fill_vocabulary_and_config(spec, translator.vocabulary)
    spec.validate()
    spec.optimize(quantization=None)  # no quantization; stores the shared embedding once
    spec.save(str(folder))
    (folder / SENTENCEPIECE).write_bytes(translator.vocabulary.model_bytes)
    (folder / "README.md").write_text(readme(decoding), encoding="utf-8")


def readme(decoding: Decoding) -> str:
    """What a user of the folder needs beyond CTranslate2's files: the decode settings."""
    d = decoding.settings
    return (f"# A translate model for CTranslate2\n\nTranslate with `beam_size={d.beam_size}` and "
            f"`length_penalty={d.length_penalty}` ({decoding.length_penalty_origin}), on the pieces of "
            f"`{SENTENCEPIECE}` (`translate.formats.ctranslate2.ctranslate2_translate` frames them as translate "
            "does). CTranslate2 divides by length ** length_penalty, translate by GNMT's ((5 + length) / 6) ** alpha: "
            "beam outputs may differ.\n")


def _fill_embeddings(spec, weights: Dict[str, np.ndarray], cfg, position_rows: int) -> None:
    """The shared embedding (inputs of both stacks and the output projection) and our position
    table: the sinusoids (interleaved sin/cos), or the learned one."""
    from translate.model import PositionalEncoding

    embedding = weights["embedding.weight"][: cfg.vocab_size]  # (V, D) without padding rows, shared by inputs and output
    if cfg.positions == Positions.learned:
        table = weights["positional_encoding.table.weight"]  # (max_positions, D)
    else:
        table = PositionalEncoding(cfg.d_model, max_len=position_rows).table.numpy()
    for stack in (spec.encoder, spec.decoder):
        stack.scale_embeddings = True  # sqrt(d_model) * E[x] + PE, as Transformer.embed
        stack.position_encodings.encodings = table
    spec.encoder.embeddings[0].weight = embedding
    spec.decoder.embeddings.weight = embedding
    spec.decoder.projection.weight = embedding
    spec.decoder.projection.bias = np.zeros(embedding.shape[0], dtype=np.float32)  # we have none


def _fill_layers(spec, weights: Dict[str, np.ndarray]) -> None:
    """Every encoder and decoder layer: attention projections, feed-forward and layer norms."""

    def linear(layer, name: str) -> None:
        layer.weight, layer.bias = weights[f"{name}.weight"], weights[f"{name}.bias"]

    def norm(layer, name: str) -> None:
        layer.gamma, layer.beta = weights[f"{name}.weight"], weights[f"{name}.bias"]

    def feed_forward(layer, prefix: str, sublayer: int) -> None:
        linear(layer.linear_0, f"{prefix}.feed_forward.w_1")
        linear(layer.linear_1, f"{prefix}.feed_forward.w_2")
        norm(layer.layer_norm, f"{prefix}.sublayer.{sublayer}.norm")  # after the residual, or before the sub-layer (pre-norm)

    for i, layer in enumerate(spec.encoder.layer):
        prefix = f"encoder_layers.{i}"
        linear(layer.self_attention.linear[0], f"{prefix}.self_attn.qkv_proj")  # fused [Q; K; V]
        linear(layer.self_attention.linear[1], f"{prefix}.self_attn.out_proj")
        norm(layer.self_attention.layer_norm, f"{prefix}.sublayer.0.norm")
        feed_forward(layer.ffn, prefix, 1)
    for i, layer in enumerate(spec.decoder.layer):
        prefix = f"decoder_layers.{i}"
        linear(layer.self_attention.linear[0], f"{prefix}.self_attn.qkv_proj")
        linear(layer.self_attention.linear[1], f"{prefix}.self_attn.out_proj")
        norm(layer.self_attention.layer_norm, f"{prefix}.sublayer.0.norm")
        linear(layer.attention.linear[0], f"{prefix}.src_attn.q_proj")
        linear(layer.attention.linear[1], f"{prefix}.src_attn.kv_proj")  # fused [K; V]
        linear(layer.attention.linear[2], f"{prefix}.src_attn.out_proj")
        norm(layer.attention.layer_norm, f"{prefix}.sublayer.1.norm")
        feed_forward(layer.ffn, prefix, 2)


def _fill_vocabulary_and_config(spec, vocabulary) -> None:
    """Our pieces (sentencepiece's, then the added symbols) as both vocabularies, and the special
    tokens and settings our model assumes."""
    pieces, specials = vocabulary.piece_names(), vocabulary.specials
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.config.unk_token, spec.config.bos_token = pieces[specials.unk], pieces[specials.bos]
    spec.config.eos_token = pieces[specials.eos]
    spec.config.decoder_start_token = pieces[specials.bos]  # our decoder starts from BOS
    spec.config.add_source_eos = True  # our sources end with EOS
    spec.config.layer_norm_epsilon = 1e-5  # torch's LayerNorm default, stated rather than left to CTranslate2


def ctranslate2_translate(
    model_dir: Union[str, Path],
    sentences: Sequence[str],
    settings: Optional[DecodeConfig] = None,
    max_batch_size: int = 64,
    device: str = "cpu",
    threads: int = 0,
) -> List[str]:
    """Translate with an exported model, framed and limited as Translator.translate with the same
    settings (default: DecodeConfig's): sources cut to max_source_length tokens, outputs capped
    by output_cap, an empty source gives an empty translation.

    With beam_size > 1 results may differ from ours: CTranslate2's length penalty divides by
    length ** length_penalty, not GNMT's ((5 + length) / 6) ** alpha.
    """
    import ctranslate2

    d = settings or DecodeConfig()
    model_dir = Path(model_dir)
    vocabulary = exported_vocabulary(model_dir)
    pieces = vocabulary.piece_names()
    ids = {piece: i for i, piece in enumerate(pieces)}
    translator = ctranslate2.Translator(str(model_dir), device=device, intra_threads=threads)
    sources = [[pieces[i] for i in encoded[: d.max_source_length]] for encoded in vocabulary.to_ids(list(sentences))]
    # One length limit per call, so group sentences of equal limit (EOS aside).
    groups: Dict[int, List[int]] = defaultdict(list)
    for index, tokens in enumerate(sources):
        if tokens:  # an empty source stays an empty translation, as in ours
            groups[d.output_cap(len(tokens))].append(index)
    outputs: List[str] = [""] * len(sources)
    banned = [[pieces[i]] for i in vocabulary.never_generated if i != vocabulary.specials.unk]  # unk: disable_unk
    for limit, indices in groups.items():
        results = translator.translate_batch(
            [sources[i] for i in indices],
            beam_size=d.beam_size,
            length_penalty=d.length_penalty,
            max_batch_size=max_batch_size,
            max_input_length=0,  # never truncate: we do not
            max_decoding_length=limit,
            min_decoding_length=0,  # an empty translation is allowed, as in ours
            disable_unk=True,
            suppress_sequences=banned,
        )
        for index, result in zip(indices, results):
            outputs[index] = vocabulary.to_text([[ids[p] for p in result.hypotheses[0]]])[0]
    return outputs


def exported_vocabulary(model_dir: Path) -> Vocabulary:
    """The sentencepiece model of an export with the special ids its marker records (exports
    from before they were recorded: the default layout)."""
    marker = json.loads((model_dir / EXPORT_MARKER).read_text(encoding="utf-8")) if (model_dir / EXPORT_MARKER).is_file() else {}
    return Vocabulary((model_dir / SENTENCEPIECE).read_bytes(), SpecialIds.from_dict(marker.get("specials")))
