"""The `translate decode` verb: beam search over a dataset split or a text file."""

from __future__ import annotations

import logging
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import torch

from translate import checkpoint, paths
from translate.config import Positions, TranslateConfig
from translate.data.batching import pad
from translate.data.loading import decode_line, load_corpus, read_lines
from translate.data.vocabulary import Vocabulary
from translate.errors import TranslateError
from translate.training.host_memory import keep_freed_memory
from translate.model import Transformer
from translate.search import Hypothesis, beam_search, sample

log = logging.getLogger("translate.decode")

@dataclass
class Translator:
    """A trained model with its vocabulary, ready to translate sentences."""

    model: Transformer
    vocabulary: Vocabulary
    languages: Optional[List[str]] = None  # [src_lang, tgt_lang] the model was trained on

    @classmethod
    def from_checkpoint(cls, path: Path) -> "Translator":
        keep_freed_memory()  # each step's (hypotheses, V) log-probs reused, not faulted in afresh
        payload = checkpoint.load(path)
        model_cfg = checkpoint.model_config(payload)
        vocabulary = checkpoint.vocabulary(payload)
        if len(vocabulary) != model_cfg.vocab_size:
            raise TranslateError(f"{path}: vocabulary has {len(vocabulary)} ids but the model {model_cfg.vocab_size}")
        model = Transformer(model_cfg, pad_id=vocabulary.specials.pad)
        try:
            model.load_state_dict(payload["model"])
        except RuntimeError as error:
            raise TranslateError(f"{path}: weights do not fit the model it describes: {str(error).splitlines()[0]}") from None
        model.eval()
        return cls(model, vocabulary, payload.get("languages"))

    def translate(self, sentences: Sequence[str], **options) -> List[str]:
        """Detokenized best translations, in input order (options: see search())."""
        return [self.vocabulary.decode([hypotheses[0].tokens])[0] for hypotheses in self.search(sentences, **options)]

    @torch.inference_mode()  # lighter than no_grad: no version counters on the cached tensors
    def search(
        self,
        sentences: Sequence[str],
        beam_size: int = 4,
        length_penalty: float = 0.6,
        max_len_a: float = 1.0,
        max_len_b: int = 50,
        tokens_per_batch: int = 16000,
        sampling: bool = False,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 1,
        max_source_length: int = 1024,
        first_line: int = 1,
    ) -> List[List[Hypothesis]]:
        """Each sentence's hypotheses, best first, in input order: one entry per sentence, and
        for an empty (or whitespace-only) one an empty translation.

        Sentences are sorted by length and batched so that a batch holds about
        tokens_per_batch padded source tokens times the beam size; the output length is
        limited to max_len_a * source length + max_len_b (paper: input length + 50). Sources
        over max_source_length tokens are cut to it (a warning names them, counting lines
        from first_line).
        """
        limit = self.model.cfg.max_positions if self.model.cfg.positions == Positions.learned else None
        if limit:  # learned positions serve this many: the source and EOS, the output and BOS
            max_source_length = min(max_source_length, limit - 1)
        encoded = self.encode_sources(sentences, max_source_length, first_line)
        specials, banned = self.vocabulary.specials, self.vocabulary.never_generated
        lengths = np.array([len(ids) + 1 for ids in encoded])  # + EOS
        order = np.argsort(-lengths, kind="stable")  # longest first: the largest batch fails early
        order = order[lengths[order] > 1]  # an empty source needs no search
        rows = 1 if sampling else beam_size
        generator = torch.Generator().manual_seed(seed)
        results: List[List[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)] for _ in encoded]
        start = 0
        while start < len(order):
            size = max(1, tokens_per_batch // (int(lengths[order[start]]) * rows))
            chunk = order[start : start + size]
            start += size
            sources = [encoded[i] for i in chunk]
            src = pad([np.asarray(s, dtype=np.int64) for s in sources], specials.pad, suffix=specials.eos)  # (B, S)
            state = self.model.start_state(src)
            max_lengths = [min(int(max_len_a * len(s) + max_len_b) + 1, limit or math.inf) for s in sources]  # EOS included
            if sampling:
                found = [[h] for h in sample(self.model.step, state, max_lengths, specials.bos, specials.eos, temperature,
                                             top_k, top_p, banned, generator)]
            else:
                found = beam_search(self.model.step, state, max_lengths, beam_size, length_penalty, specials.bos,
                                    specials.eos, banned)
            for index, hypotheses in zip(chunk, found):
                results[index] = hypotheses
        return results


    def encode_sources(self, sentences: Sequence[str], max_source_length: int, first_line: int = 1) -> List[List[int]]:
        """Token ids of each sentence, at most max_source_length of them; a warning names the
        lines cut."""
        encoded = self.vocabulary.encode(list(sentences))
        cut = [first_line + i for i, ids in enumerate(encoded) if len(ids) > max_source_length]
        if cut:
            shown = ", ".join(map(str, cut[:10])) + (f" and {len(cut) - 10} more" if len(cut) > 10 else "")
            log.warning(f"line{'s' if len(cut) > 1 else ''} {shown}: longer than decode.max_source_length="
                        f"{max_source_length} tokens, cut to it")
            encoded = [ids[:max_source_length] for ids in encoded]
        return encoded


def write_lines(path: Path, lines: Sequence[str]) -> None:
    """Write atomically: a failure never leaves a half-written file in place of an old one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.writelines(line.replace("\r", " ").replace("\n", " ") + "\n" for line in lines)  # a line each
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def search_options(cfg: TranslateConfig) -> dict:
    """The decode.* settings that shape the search, as Translator.search() keywords (their
    rules are checked at start-up: DecodeConfig)."""
    d = cfg.decode
    return dict(
        beam_size=d.beam_size, length_penalty=d.length_penalty, max_len_a=d.max_len_a, max_len_b=d.max_len_b,
        tokens_per_batch=d.tokens_per_batch, sampling=d.sampling, temperature=d.temperature,
        top_k=d.top_k, top_p=d.top_p, seed=d.seed, max_source_length=d.max_source_length,
    )


def format_output(translator: Translator, results: List[List[Hypothesis]], nbest: int, first_index: int = 0) -> List[str]:
    """One line per sentence; with nbest > 1, `index<TAB>score<TAB>text` for each hypothesis."""
    if nbest == 1:
        return translator.vocabulary.decode([hypotheses[0].tokens for hypotheses in results])
    lines = []
    for index, hypotheses in enumerate(results, first_index):
        texts = translator.vocabulary.decode([h.tokens for h in hypotheses[:nbest]])
        lines.extend(f"{index}\t{h.score:.4f}\t{text}" for h, text in zip(hypotheses, texts))
    return lines


def decode(cfg: TranslateConfig) -> Optional[Path]:
    """Translate decode.input (a file, or - for stdin to stdout) or the decode.split of the
    data; returns the output path."""
    options = search_options(cfg)
    translator = Translator.from_checkpoint(checkpoint.for_decoding(cfg))
    wanted = [cfg.data.src_lang, cfg.data.tgt_lang]
    if translator.languages and list(translator.languages) != wanted:
        src, tgt = translator.languages
        raise TranslateError(f"the checkpoint translates {src}->{tgt}, but the data asks for {wanted[0]}->{wanted[1]}")
    if cfg.decode.input == "-":
        _stream(translator, options, cfg.decode.nbest)
        return None
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
    method = "sampling" if cfg.decode.sampling else f"beam {cfg.decode.beam_size}, alpha {cfg.decode.length_penalty}"
    log.info(f"translating {len(sources):,} sentences of {what} ({method})")
    started = time.monotonic()
    results = translator.search(sources, **options)
    seconds = time.monotonic() - started
    write_lines(output, format_output(translator, results, cfg.decode.nbest))
    if references is not None:
        write_lines(paths.decode_reference(cfg), references)
    tokens = sum(len(hypotheses[0].tokens) + 1 for hypotheses in results)
    log.info(
        f"wrote {output}: {len(sources) / seconds:.1f} sentences/s, {tokens / seconds:.0f} target tokens/s "
        f"({seconds:.1f} s, {torch.get_num_threads()} threads)"
    )
    return output


def _stream(translator: Translator, options: dict, nbest: int) -> None:
    """Interactive use: each line from stdin is translated and printed at once. Lines end at
    \n alone, as in files (text mode would also end them at a lone \r)."""
    for index, raw in enumerate(sys.stdin.buffer):
        line = decode_line(raw, Path("<stdin>"), index + 1)
        results = translator.search([line], first_line=index + 1, **options)
        for text in format_output(translator, results, nbest, first_index=index):
            print(text.replace("\n", " "), flush=True)
