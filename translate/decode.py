"""The `translate decode` verb: beam search over a dataset split or a text file."""

from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import torch

from translate import checkpoint, paths
from translate.config import TranslateConfig
from translate.data.batching import pad
from translate.data.loading import load_corpus, read_lines
from translate.data.vocabulary import BOS, EOS, PAD, UNK, Vocabulary
from translate.errors import TranslateError
from translate.model import Transformer
from translate.search import beam_search, greedy_search

log = logging.getLogger("translate.decode")


@dataclass
class Translator:
    """A trained model with its vocabulary, ready to translate sentences."""

    model: Transformer
    vocabulary: Vocabulary
    languages: Optional[List[str]] = None  # [src_lang, tgt_lang] the model was trained on

    @classmethod
    def from_checkpoint(cls, path: Path) -> "Translator":
        payload = checkpoint.load(path)
        model_cfg = checkpoint.model_config(payload)
        vocabulary = Vocabulary(payload["vocabulary"])
        if len(vocabulary) != model_cfg.vocab_size:
            raise TranslateError(f"{path}: vocabulary has {len(vocabulary)} pieces but the model {model_cfg.vocab_size}")
        model = Transformer(model_cfg, pad_id=PAD)
        try:
            model.load_state_dict(payload["model"])
        except RuntimeError as error:
            raise TranslateError(f"{path}: weights do not fit the model it describes: {str(error).splitlines()[0]}") from None
        model.eval()
        return cls(model, vocabulary, payload.get("languages"))

    def translate(
        self,
        sentences: Sequence[str],
        beam_size: int = 4,
        length_penalty: float = 0.6,
        max_len_a: float = 1.0,
        max_len_b: int = 50,
        tokens_per_batch: int = 4000,
    ) -> List[str]:
        """Detokenized translations, in input order. Batches group sentences of similar length."""
        encoded = self.vocabulary.encode(list(sentences))
        lengths = np.array([len(ids) + 1 for ids in encoded])  # + EOS
        order = np.argsort(-lengths, kind="stable")  # longest first: the largest batch fails early
        outputs: List[Optional[List[int]]] = [None] * len(encoded)
        start = 0
        while start < len(order):
            # Beam search holds beam_size rows per sentence.
            size = max(1, tokens_per_batch // (int(lengths[order[start]]) * beam_size))
            chunk = order[start : start + size]
            start += size
            for index, tokens in zip(chunk, self._search([encoded[i] for i in chunk], beam_size, length_penalty, max_len_a, max_len_b)):
                outputs[index] = tokens
        return self.vocabulary.decode(outputs)

    @torch.no_grad()
    def _search(self, sources: List[List[int]], beam_size, alpha, max_len_a, max_len_b) -> List[List[int]]:
        src = pad([np.asarray(s, dtype=np.int64) for s in sources], suffix=EOS)  # (B, S)
        state = self.model.start_state(src)
        # Output length limit, EOS included: a * source length + b.
        max_lengths = [int(max_len_a * len(s) + max_len_b) + 1 for s in sources]
        banned = (PAD, BOS, UNK)
        if beam_size == 1:
            return greedy_search(self.model.step, state, max_lengths, BOS, EOS, banned=banned)
        finished = beam_search(self.model.step, state, max_lengths, beam_size, alpha, BOS, EOS, banned=banned)
        return [hypotheses[0].tokens for hypotheses in finished]


def write_lines(path: Path, lines: Sequence[str]) -> None:
    """Write atomically: a failure never leaves a half-written file in place of an old one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.writelines(line.replace("\n", " ") + "\n" for line in lines)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def decode(cfg: TranslateConfig) -> Path:
    """Translate decode.input or the decode.split of the data; returns the output path."""
    translator = Translator.from_checkpoint(paths.checkpoint(cfg))
    wanted = [cfg.data.src_lang, cfg.data.tgt_lang]
    if translator.languages and list(translator.languages) != wanted:
        src, tgt = translator.languages
        raise TranslateError(f"the checkpoint translates {src}->{tgt}, but the data asks for {wanted[0]}->{wanted[1]}")
    references: Optional[List[str]] = None
    if cfg.decode.input:
        sources = read_lines(cfg.decode.input)
        what = cfg.decode.input
    else:
        corpus = load_corpus(cfg.data, cfg.decode.split)
        sources, references = corpus.pairs()
        what = corpus.description
    output = paths.decode_output(cfg)
    if cfg.decode.input and output.resolve() == Path(cfg.decode.input).resolve():
        raise TranslateError(f"decode.output {output} would overwrite the input")
    torch.set_grad_enabled(False)
    log.info(f"translating {len(sources):,} sentences of {what} (beam {cfg.decode.beam_size}, alpha {cfg.decode.length_penalty})")
    started = time.monotonic()
    hypotheses = translator.translate(
        sources,
        beam_size=cfg.decode.beam_size,
        length_penalty=cfg.decode.length_penalty,
        max_len_a=cfg.decode.max_len_a,
        max_len_b=cfg.decode.max_len_b,
        tokens_per_batch=cfg.decode.tokens_per_batch,
    )
    seconds = time.monotonic() - started
    write_lines(output, hypotheses)
    if references is not None:
        write_lines(paths.decode_reference(cfg), references)
    tokens = sum(len(ids) for ids in translator.vocabulary.encode(hypotheses))
    log.info(
        f"wrote {output}: {len(sources) / seconds:.1f} sentences/s, {tokens / seconds:.0f} target tokens/s "
        f"({seconds:.1f} s, {torch.get_num_threads()} threads)"
    )
    return output
