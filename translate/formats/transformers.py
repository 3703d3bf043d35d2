"""A checkpoint as a Hugging Face transformers model: MarianMTModel and MarianTokenizer.

Marian in transformers is the paper's post-norm Transformer with scaled embeddings, but it puts
the sines of its position table in the first half of the features and the cosines in the
second, where ours interleaves them (section 3.5). A fixed permutation of the model dimension,
applied to every weight that reads or writes it, maps our model onto Marian exactly (the
residual stream is the same up to the order of its features; LayerNorm does not care).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional

import torch
from torch import Tensor

from translate.core.run_record import RunRecord
from translate.core.config import DecodeConfig, ModelConfig
from translate.core.errors import TranslateError
from translate.data.vocabulary import Vocabulary
from translate.formats.model_card import model_card
from translate.translator import Decoding

LONGEST_SOURCE = 511  # source tokens (EOS aside) the export serves: the tokenizer's model_max_length is one more
EXTRA = "transformers"  # the optional dependency group that brings transformers and safetensors


def marian_permutation(d_model: int) -> Tensor:
    """(D,) Marian's feature j is our feature perm[j]: sin(pos * w_k) is our 2k and Marian's k,
    cos(pos * w_k) our 2k + 1 and Marian's D/2 + k."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def marian_state_dict(state: Dict[str, Tensor], cfg: ModelConfig) -> Dict[str, Tensor]:
    """Our weights under Marian's names, the model dimension permuted, without the vocabulary
    padding rows (never looked up or predicted)."""
    perm = marian_permutation(cfg.d_model)
    reads = lambda name: state[name][:, perm]  # noqa: E731  (out, D) weights applied to the residual stream
    writes = lambda name: state[name][perm]  # noqa: E731  (D, ...) weights and biases added to it
    embedding = state["embedding.weight"][: cfg.vocab_size, perm]  # (V, D)
    out = {name: embedding for name in ("model.shared.weight", "model.encoder.embed_tokens.weight",
                                        "model.decoder.embed_tokens.weight", "lm_head.weight")}
    out["final_logits_bias"] = torch.zeros(1, cfg.vocab_size)  # we have none

    def attention(ours: str, theirs: str, fused: List[tuple]) -> None:
        """fused: (our fused projection, the Marian projections it splits into)."""
        for name, parts in fused:
            for part, weight, bias in zip(parts, reads(f"{ours}.{name}.weight").chunk(len(parts)),
                                          state[f"{ours}.{name}.bias"].chunk(len(parts))):
                out[f"{theirs}.{part}.weight"], out[f"{theirs}.{part}.bias"] = weight, bias  # per-head dims: as they are
        out[f"{theirs}.out_proj.weight"] = writes(f"{ours}.out_proj.weight")
        out[f"{theirs}.out_proj.bias"] = writes(f"{ours}.out_proj.bias")

    def block(ours: str, theirs: str, norms: List[str]) -> None:
        out[f"{theirs}.fc1.weight"], out[f"{theirs}.fc1.bias"] = reads(f"{ours}.feed_forward.w_1.weight"), state[f"{ours}.feed_forward.w_1.bias"]
        out[f"{theirs}.fc2.weight"], out[f"{theirs}.fc2.bias"] = writes(f"{ours}.feed_forward.w_2.weight"), writes(f"{ours}.feed_forward.w_2.bias")
        for index, norm in enumerate(norms):  # post-norm: sublayer i's LayerNorm after its residual
            for part in ("weight", "bias"):
                out[f"{theirs}.{norm}.{part}"] = writes(f"{ours}.sublayer.{index}.norm.{part}")

    for i in range(cfg.layers):
        ours, theirs = f"encoder_layers.{i}", f"model.encoder.layers.{i}"
        attention(f"{ours}.self_attn", f"{theirs}.self_attn", [("qkv_proj", ("q_proj", "k_proj", "v_proj"))])
        block(ours, theirs, ["self_attn_layer_norm", "final_layer_norm"])
        ours, theirs = f"decoder_layers.{i}", f"model.decoder.layers.{i}"
        attention(f"{ours}.self_attn", f"{theirs}.self_attn", [("qkv_proj", ("q_proj", "k_proj", "v_proj"))])
        attention(f"{ours}.src_attn", f"{theirs}.encoder_attn", [("q_proj", ("q_proj",)), ("kv_proj", ("k_proj", "v_proj"))])
        block(ours, theirs, ["self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"])
    return {name: tensor.float().contiguous() for name, tensor in out.items()}


def longest_output(decode: DecodeConfig) -> int:
    """Generated tokens for the longest source (LONGEST_SOURCE), EOS included: decode's output limit."""
    return decode.output_limit(LONGEST_SOURCE)


def marian_config(cfg: ModelConfig, vocabulary: Vocabulary, decode: DecodeConfig):
    """MarianConfig with every setting ours differs from Marian's defaults in spelled out."""
    from transformers import MarianConfig

    specials = vocabulary.specials
    return MarianConfig(
        vocab_size=cfg.vocab_size, d_model=cfg.d_model, encoder_layers=cfg.layers, decoder_layers=cfg.layers,
        encoder_attention_heads=cfg.heads, decoder_attention_heads=cfg.heads, encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff, activation_function="relu", scale_embedding=True, dropout=cfg.dropout,
        attention_dropout=0.0, activation_dropout=0.0, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        # Positions of the longest input and of the decoder start plus the longest output.
        max_position_embeddings=max(LONGEST_SOURCE + 1, longest_output(decode) + 1),
        pad_token_id=specials.pad, eos_token_id=specials.eos, bos_token_id=specials.bos,
        decoder_start_token_id=specials.bos,  # ours starts from BOS, Marian's default from pad
        forced_eos_token_id=None,  # set in generation_config: save_pretrained (4.57) would move it there, warning
    )


def generation_config(vocabulary: Vocabulary, decode: DecodeConfig):
    """Our decode defaults. The beam search's length penalty differs: transformers divides by
    length ** length_penalty, ours by GNMT's ((5 + length) / 6) ** alpha (docs/export.md)."""
    from transformers import GenerationConfig

    specials = vocabulary.specials
    return GenerationConfig(
        num_beams=decode.beam_size, length_penalty=decode.length_penalty, max_length=longest_output(decode) + 1,
        early_stopping=True, decoder_start_token_id=specials.bos, bos_token_id=specials.bos, eos_token_id=specials.eos,
        pad_token_id=specials.pad, forced_eos_token_id=specials.eos,  # at the length limit EOS is forced, as in our search
        suppress_tokens=sorted(vocabulary.never_generated),  # pad, a second BOS, unk: never produced, as ours
    )


def write_tokenizer(vocabulary: Vocabulary, folder: Path, languages: Optional[List[str]]) -> None:
    """MarianTokenizer's files: the sentencepiece model as source and target model, and the id
    map (every piece, then our added symbols, at the ids our model uses)."""
    names, specials = vocabulary.piece_names(), vocabulary.specials
    (folder / "source.spm").write_bytes(vocabulary.model_bytes)
    (folder / "target.spm").write_bytes(vocabulary.model_bytes)
    (folder / "vocab.json").write_text(json.dumps({name: i for i, name in enumerate(names)}, ensure_ascii=False, indent=0),
                                       encoding="utf-8")
    source, target = (languages or [None, None])[:2]
    settings = {"tokenizer_class": "MarianTokenizer", "source_lang": source, "target_lang": target,
                "unk_token": names[specials.unk], "eos_token": names[specials.eos], "pad_token": names[specials.pad],
                "model_max_length": LONGEST_SOURCE + 1, "separate_vocabs": False, "clean_up_tokenization_spaces": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def write_transformers(translator, folder: Path, decoding: Decoding, run_dir: Path) -> None:
    """The folder MarianMTModel.from_pretrained and MarianTokenizer.from_pretrained load offline,
    with a model card from run_dir's run record; generate() defaults to `decoding`'s settings
    (generation_config.json), the card says where their length penalty came from."""
    try:
        from transformers import MarianMTModel
    except ImportError:
        raise TranslateError(f"export.format=transformers needs the {EXTRA} extra: "
                             f"pip install -c constraints.txt -e '.[{EXTRA}]'") from None
    cfg, vocabulary, decode = translator.model.cfg, translator.vocabulary, decoding.settings
    model = MarianMTModel(marian_config(cfg, vocabulary, decode))
    missing, unexpected = model.load_state_dict(marian_state_dict(translator.model.state_dict(), cfg), strict=False)
    left = [name for name in missing if "embed_positions" not in name]  # Marian computes its own sinusoids
    if left or unexpected:
        raise RuntimeError(f"Marian's weights do not match ours: missing {left}, unexpected {unexpected}")
    model.generation_config = generation_config(vocabulary, decode)
    model.save_pretrained(str(folder), safe_serialization=True)
    write_tokenizer(vocabulary, folder, translator.languages)
    card = model_card(RunRecord.load(run_dir), translator.languages, len(vocabulary),
                      translator.model.num_parameters(), decode, longest_source=LONGEST_SOURCE,
                      lowercase=translator.lowercase, length_penalty_origin=decoding.length_penalty_origin)
    (folder / "README.md").write_text(card, encoding="utf-8")


class TransformersTranslator:
    """An exported folder loaded once through transformers' own AutoTokenizer and
    AutoModelForSeq2SeqLM, translating as Translator.translate does with the same settings."""

    def __init__(self, model_dir: Path):
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = AutoModelForSeq2SeqLM.from_pretrained(str(model_dir)).eval()

    def translate(self, sentences: List[str], settings: Optional[DecodeConfig] = None, batch_size: int = 64) -> List[str]:
        """Translate with generate() at settings.beam_size (default: DecodeConfig's), each output at
        most settings.output_cap tokens. generate() takes one limit per batch: each batch
        (sentences of similar length) gets its longest sentence's, and longer outputs are cut to
        their own sentence's cap afterwards, which for greedy search is what ours yields there."""
        d = settings or DecodeConfig()
        tokenizer = self.tokenizer
        encoded = tokenizer(list(sentences))["input_ids"]  # each ends with EOS
        limits = [d.output_limit(len(ids) - 1) for ids in encoded]  # generated tokens, EOS included, as ours
        order = sorted(range(len(sentences)), key=lambda i: len(encoded[i]))
        outputs: List[str] = [""] * len(sentences)
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            batch = tokenizer.pad({"input_ids": [encoded[i] for i in chunk]}, return_tensors="pt")
            with torch.inference_mode():
                generated = self.model.generate(**batch, num_beams=d.beam_size, max_length=None,
                                                max_new_tokens=max(limits[i] for i in chunk))  # (B, 1 + generated), decoder start first
            for index, row in zip(chunk, generated.tolist()):
                outputs[index] = tokenizer.decode(row[1 : limits[index]], skip_special_tokens=True)  # before EOS
        return outputs


def transformers_translate(model_dir: Path, sentences: List[str], settings: Optional[DecodeConfig] = None,
                           batch_size: int = 64) -> List[str]:
    """Load an exported folder and translate (TransformersTranslator.translate)."""
    return TransformersTranslator(model_dir).translate(sentences, settings, batch_size)
