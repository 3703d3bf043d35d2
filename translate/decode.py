"""The `translate decode` verb: beam search over a dataset split or a text file."""

from __future__ import annotations

import itertools
import logging
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import torch

from translate import checkpoint, paths
from translate.config import DecodeConfig, Positions, Precision, TranslateConfig
from translate.data.batching import pad
from translate.data.loading import decode_line, load_corpus, read_lines
from translate.data.vocabulary import Vocabulary
from translate.errors import TranslateError
from translate.training.host_memory import keep_freed_memory
from translate.training.precision import resolved
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
        model_cfg = checkpoint.model_config(payload, path)
        vocabulary = checkpoint.vocabulary(payload, path)
        if len(vocabulary) != model_cfg.vocab_size:
            raise TranslateError(f"{path}: vocabulary has {len(vocabulary)} ids but the model {model_cfg.vocab_size}")
        checkpoint.check_weights(path, payload["model"], model_cfg)
        model = Transformer(model_cfg, pad_id=vocabulary.specials.pad)
        model.load_state_dict(payload["model"])
        model.eval()
        return cls(model, vocabulary, payload.get("languages"))

    def translate(self, sentences: Sequence[str], settings: Optional[DecodeConfig] = None) -> List[str]:
        """Detokenized best translations, in input order (settings: see search())."""
        return [self.vocabulary.decode([hypotheses[0].tokens])[0] for hypotheses in self.search(sentences, settings)]

    @torch.inference_mode()  # lighter than no_grad: no version counters on the cached tensors
    def search(self, sentences: Sequence[str], settings: Optional[DecodeConfig] = None,
               first_line: int = 1) -> List[List[Hypothesis]]:
        """Each sentence's hypotheses, best first, in input order: one entry per sentence, and
        for an empty (or whitespace-only) one an empty translation.

        settings (default: DecodeConfig's defaults) shape the search: beam search with
        beam_size and length_penalty, or sampling; sentences are sorted by length and batched
        so that a batch holds about tokens_per_batch padded source tokens times the beam size;
        outputs are capped by settings.output_cap. Sources over max_source_length tokens are
        cut to it (a warning names them, counting lines from first_line).
        """
        d = settings or DecodeConfig()
        limit = self.position_limit
        # Learned positions serve this many: the source and EOS, the output and BOS.
        max_source_length = min(d.max_source_length, limit - 1) if limit else d.max_source_length
        encoded = self.encode_sources(sentences, max_source_length, first_line)
        lengths = np.array([len(ids) + 1 for ids in encoded])  # + EOS
        order = np.argsort(-lengths, kind="stable")  # longest first: the largest batch fails early
        order = order[lengths[order] > 1]  # an empty source needs no search
        rows = 1 if d.sampling else d.beam_size
        generator = torch.Generator().manual_seed(d.seed)
        results: List[List[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)] for _ in encoded]
        with self.autocast(d):  # one context: the weights are cast to bf16 once, not at every step
            self._search_batches(encoded, lengths, order, rows, d, generator, results)
        return results

    @property
    def position_limit(self) -> Optional[int]:
        """The positions a learned table serves (sources and outputs alike), None for sinusoids."""
        return self.model.cfg.max_positions if self.model.cfg.positions == Positions.learned else None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def in_bf16(self, d: DecodeConfig) -> bool:
        """Whether these settings decode in bf16: decode.precision=bf16, or auto where the
        model's device computes bf16 natively (GPUs; CPUs with AMX or AVX512-BF16)."""
        return resolved(d.precision, self.device) == Precision.bf16

    def autocast(self, d: DecodeConfig) -> torch.autocast:
        """bf16 autocast on the model's device where in_bf16; disabled (fp32) elsewhere."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.in_bf16(d))

    def _search_batches(self, encoded: List[List[int]], lengths: np.ndarray, order: np.ndarray, rows: int,
                        d: DecodeConfig, generator: torch.Generator, results: List[List[Hypothesis]]) -> None:
        """Search the sentences of `order` in batches of about d.tokens_per_batch, longest first,
        into results."""
        limit = self.position_limit
        specials, banned = self.vocabulary.specials, self.vocabulary.never_generated
        start = 0
        while start < len(order):
            size = max(1, d.tokens_per_batch // (int(lengths[order[start]]) * rows))
            chunk = order[start : start + size]
            start += size
            state = self.model.start_state(self._sources(encoded, chunk))
            max_lengths = [min(d.output_cap(len(encoded[i])) + 1, limit or math.inf) for i in chunk]  # EOS included
            if d.sampling:
                found = [[h] for h in sample(self.model.step, state, max_lengths, specials.bos, specials.eos, d.temperature,
                                             d.top_k, d.top_p, banned, generator)]
            else:
                found = beam_search(self.model.step, state, max_lengths, d.beam_size, d.length_penalty, specials.bos,
                                    specials.eos, banned)
            for index, hypotheses in zip(chunk, found):
                results[index] = hypotheses

    def _sources(self, encoded: List[List[int]], chunk: np.ndarray) -> torch.Tensor:
        """(B, S) the chunk's sources, each with EOS, right-padded."""
        lengths = np.array([len(encoded[i]) for i in chunk], dtype=np.int64)
        offsets = np.zeros(len(chunk) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        tokens = np.fromiter(itertools.chain.from_iterable(encoded[i] for i in chunk), dtype=np.int64, count=int(offsets[-1]))
        specials = self.vocabulary.specials
        return pad(tokens, offsets, np.arange(len(chunk)), specials.pad, suffix=specials.eos)

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
    """Write a line per entry, atomically (paths.atomic_write): a failure never leaves a
    half-written file in place of an old one."""
    with paths.atomic_write(path) as file:
        file.writelines(line.replace("\r", " ").replace("\n", " ") + "\n" for line in lines)  # a line each


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
    translator = Translator.from_checkpoint(checkpoint.for_decoding(cfg))
    wanted = [cfg.data.src_lang, cfg.data.tgt_lang]
    if translator.languages and list(translator.languages) != wanted:
        src, tgt = translator.languages
        raise TranslateError(f"the checkpoint translates {src}->{tgt}, but the data asks for {wanted[0]}->{wanted[1]}")
    if cfg.decode.input == "-":
        _stream(translator, cfg.decode)
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
    problem = paths.usable_folder(output.parent)  # found before the search, not after it
    if problem:
        raise TranslateError(f"cannot write {output}: {problem}")
    method = "sampling" if cfg.decode.sampling else f"beam {cfg.decode.beam_size}, alpha {cfg.decode.length_penalty}"
    method = ("bf16, " if translator.in_bf16(cfg.decode) else "") + method
    log.info(f"translating {len(sources):,} sentences of {what} ({method})")
    started = time.monotonic()
    results = translator.search(sources, cfg.decode)
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


def _stream(translator: Translator, settings: DecodeConfig) -> None:
    """Interactive use: each line from stdin is translated and printed at once. Lines end at
    \n alone, as in files (text mode would also end them at a lone \r)."""
    for index, raw in enumerate(sys.stdin.buffer):
        line = decode_line(raw, Path("<stdin>"), index + 1)
        results = translator.search([line], settings, first_line=index + 1)
        for text in format_output(translator, results, settings.nbest, first_index=index):
            print(text.replace("\n", " "), flush=True)
