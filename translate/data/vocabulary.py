"""The joint source-target sentencepiece vocabulary (paper, section 5.1: shared BPE)."""

from __future__ import annotations

import io
import itertools
import math
import random
from typing import Iterable, Iterator, List

import sentencepiece as spm

from translate.errors import TranslateError

PAD, UNK, BOS, EOS = 0, 1, 2, 3  # fixed ids, so that the model and the batches agree


class Vocabulary:
    """A sentencepiece model, kept as bytes so that it travels inside checkpoints."""

    def __init__(self, model_bytes: bytes):
        self.model_bytes = model_bytes
        self.processor = spm.SentencePieceProcessor(model_proto=model_bytes)
        if (self.processor.pad_id(), self.processor.bos_id(), self.processor.eos_id()) != (PAD, BOS, EOS):
            raise TranslateError("sentencepiece model must use pad=0, unk=1, bos=2, eos=3")

    def __len__(self) -> int:
        return self.processor.get_piece_size()

    def encode(self, sentences: List[str], threads: int = 2) -> List[List[int]]:
        """Token ids without BOS/EOS (the batches add them)."""
        return self.processor.encode(sentences, out_type=int, num_threads=threads)

    def decode(self, ids: List[List[int]]) -> List[str]:
        return self.processor.decode(ids)

    @classmethod
    def train(
        cls,
        sentences: Iterable[str],
        vocab_size: int,
        model_type: str = "bpe",
        sample_size: int = 2_000_000,
        seed: int = 1,
        threads: int = 2,
    ) -> "Vocabulary":
        """Train on a seeded random sample of at most sample_size of the given sentences (both
        languages together): the same sentences and settings give the same vocabulary."""
        spm.set_random_generator_seed(seed)
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(reservoir_sample(_non_empty(sentences), sample_size, seed)),
                model_writer=model,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=1.0,
                input_sentence_size=0,  # sampled above: sentencepiece's own sampling is not seeded
                shuffle_input_sentence=False,
                hard_vocab_limit=False,  # small corpora get a smaller vocabulary, not an error
                pad_id=PAD,
                unk_id=UNK,
                bos_id=BOS,
                eos_id=EOS,
                num_threads=threads,
                minloglevel=2,
            )
        except RuntimeError as error:
            raise TranslateError(f"sentencepiece training failed: {str(error).splitlines()[0]}") from None
        return cls(model.getvalue())


def reservoir_sample(items: Iterable[str], size: int, seed: int) -> List[str]:
    """A uniform random sample of `size` items in one pass and O(size) memory (Li's
    Algorithm L: random skips, so most items cost no random draw)."""
    rng = random.Random(seed)
    iterator = iter(items)
    sample = list(itertools.islice(iterator, size))
    if len(sample) < size or size == 0:
        return sample
    weight = math.exp(math.log(rng.random()) / size)
    while True:
        skip = int(math.log(rng.random()) / math.log(1 - weight))
        chosen = next(itertools.islice(iterator, skip, skip + 1), None)
        if chosen is None:
            return sample
        sample[rng.randrange(size)] = chosen
        weight *= math.exp(math.log(rng.random()) / size)


def _non_empty(sentences: Iterable[str]) -> Iterator[str]:
    for sentence in sentences:
        if sentence.strip():
            yield sentence
