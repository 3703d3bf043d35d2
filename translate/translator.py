"""The Translator: a trained model with its vocabulary, translating sentences with the search
its settings (DecodeConfig) ask for. decode, tune, validation during training, plot and export
all translate through it.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from translate.checkpoint import Checkpoint, GenerationSettings, Identity
from translate.core.command_line import CommandLine
from translate.core.choices import Positions, Precision
from translate.core.config import DecodeConfig
from translate.core.errors import TranslateError
from translate.core.host_memory import keep_freed_memory
from translate.core.precision import resolved
from translate.data.batching import pad
from translate.data.vocabulary import Vocabulary
from translate.model import Transformer
from translate.search import Hypothesis, Symbols, search

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def decoding_products() -> Tuple[bool, bool]:
    """Which of decoding's fp32 products run on oneDNN with prepacked weights
    (kernels.PackedWeight) instead of torch's MKL products: (the output projection, the
    layers'), chosen by the instructions torch dispatches to on this CPU, never by its vendor.

    oneDNN's prepacked product wins for the wide output projection on every x86 CPU torch runs
    oneDNN on, but for the narrower layers' products only where it dispatches AVX-512 (at AVX2
    MKL's are as fast or faster: docs/results.md, "Decoding"). Elsewhere (Arm, other builds)
    MKL's products, as training's."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not torch.backends.mkldnn.is_available():
        return False, False
    capability = torch.backends.cpu.get_cpu_capability()  # "AVX512", "AVX2" or "DEFAULT"; ATEN_CPU_CAPABILITY lowers it
    return capability in ("AVX2", "AVX512"), capability == "AVX512"


class Decoding(NamedTuple):
    """Settings to translate with, and where their length penalty came from (said in exports)."""

    settings: DecodeConfig
    length_penalty_origin: str


@dataclass
class Translator:
    """A trained model with its vocabulary, ready to translate sentences."""

    model: Transformer
    vocabulary: Vocabulary
    languages: Optional[List[str]] = None  # [src_lang, tgt_lang] the model was trained on
    lowercase: bool = False  # trained on lowercased text (data.lowercase): sources are lowercased too

    identity: Optional[Identity] = None  # which weights a checkpoint gave it
    generation: Optional[GenerationSettings] = None  # what translate tune chose for these weights, if anything

    @classmethod
    def from_checkpoint(cls, path: Path) -> "Translator":
        """The checkpoint's model and vocabulary, and the settings tune chose for its weights."""
        keep_freed_memory()  # each step's (hypotheses, V) log-probs reused, not faulted in afresh
        saved = Checkpoint.load(path)
        model_cfg, vocabulary = saved.model_config(), saved.vocabulary()
        if len(vocabulary) != model_cfg.vocab_size:
            raise TranslateError(f"{path}: vocabulary has {len(vocabulary)} ids but the model {model_cfg.vocab_size}")
        model = Transformer(model_cfg, pad_id=vocabulary.specials.pad)
        try:  # strict: every name, no other, each of the model's shape
            model.load_state_dict(saved.model)
        except (RuntimeError, TypeError, AttributeError) as error:
            saved.check_weights(model_cfg)  # names the weight at fault (it builds a second model for the shapes)
            raise TranslateError(f"{path}: its weights do not fit its model settings: {error}") from None
        model.eval()
        output, layers = decoding_products()
        model.prepack_products(output=output, layers=layers)
        return cls(model, vocabulary, saved.languages, saved.lowercase, saved.identity(), saved.generation())

    def decoding(self, settings: DecodeConfig, command: Optional[CommandLine] = None) -> Decoding:
        """The settings to translate with: decode.length_penalty as the command line gives it;
        else the alpha translate tune chose for these weights; else the configuration's (the
        preset's, or the paper's 0.6)."""
        if command is not None and command.sets("decode.length_penalty"):
            return Decoding(settings, "given on the command line")
        if self.generation is not None:
            tuned = dataclasses.replace(settings, length_penalty=self.generation.length_penalty)
            return Decoding(tuned, self.generation.origin())
        return Decoding(settings, "the configuration's: translate tune chose none for these weights")

    def references(self, lines: Sequence[str]) -> List[str]:
        """References as this model's output is scored against: lowercased for a model of
        lowercased text, whatever data.lowercase says where it decodes."""
        return [line.lower() for line in lines] if self.lowercase else list(lines)

    def translate(self, sentences: Sequence[str], settings: Optional[DecodeConfig] = None) -> List[str]:
        """Detokenized best translations, in input order (settings: see search())."""
        return [self.vocabulary.to_text([hypotheses[0].tokens])[0] for hypotheses in self.search(sentences, settings)]

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
            self._search_batches(encoded, lengths, order, rows, d, generator=generator, results=results)
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
                        d: DecodeConfig, *, generator: torch.Generator, results: List[List[Hypothesis]]) -> None:
        """Search the sentences of `order` in batches of about d.tokens_per_batch, longest first,
        into results."""
        limit = self.position_limit
        specials = self.vocabulary.specials
        symbols = Symbols(specials.bos, specials.eos, tuple(self.vocabulary.never_generated))
        start = 0
        while start < len(order):
            size = max(1, d.tokens_per_batch // (int(lengths[order[start]]) * rows))
            chunk = order[start : start + size]
            start += size
            state = self.model.start_state(self._sources(encoded, chunk))
            max_lengths = [min(d.output_limit(len(encoded[i])), limit or math.inf) for i in chunk]
            found = search(self.model.step, state, max_lengths, d, symbols, generator)
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
        encoded = self.vocabulary.to_ids([s.lower() for s in sentences] if self.lowercase else list(sentences))
        cut = [first_line + i for i, ids in enumerate(encoded) if len(ids) > max_source_length]
        if cut:
            shown = ", ".join(map(str, cut[:10])) + (f" and {len(cut) - 10} more" if len(cut) > 10 else "")
            log.warning(f"line{'s' if len(cut) > 1 else ''} {shown}: longer than decode.max_source_length="
                        f"{max_source_length} tokens, cut to it")
            encoded = [ids[:max_source_length] for ids in encoded]
        return encoded
