"""The joint source-target sentencepiece vocabulary (paper, section 5.1: shared BPE), ours or
any given sentencepiece model, and where the model's special symbols are in it."""

from __future__ import annotations

import io
import itertools
import math
import random
from dataclasses import asdict, dataclass
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

import sentencepiece as spm

from translate.core.errors import TranslateError

NAMES = {"pad": "<pad>", "unk": "<unk>", "bos": "<s>", "eos": "</s>"}  # sentencepiece's default piece names


@dataclass(frozen=True)
class SpecialIds:
    """The model's ids of its special symbols. Our own vocabularies (and every checkpoint from
    before the mapping was recorded) use this default layout: pad 0, unk 1, bos 2, eos 3."""

    pad: int = 0  # fills batches up to their longest sentence; never predicted
    unk: int = 1  # pieces the sentencepiece model does not know
    bos: int = 2  # the decoder's first input
    eos: int = 3  # ends every source and every output

    def as_dict(self) -> Dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, ids: Optional[Mapping[str, int]]) -> "SpecialIds":
        """From a checkpoint's record; none recorded is the default layout."""
        return cls(**{name: int(ids[name]) for name in NAMES}) if ids else cls()


OUR_LAYOUT = SpecialIds()  # what Vocabulary.train writes


class Vocabulary:
    """A sentencepiece model (kept as bytes, so that it travels inside checkpoints) and where the
    model's special symbols are: on the sentencepiece model's control and unknown pieces where it
    has them, else on ids added after its pieces (which never reach sentencepiece)."""

    def __init__(self, model_bytes: bytes, specials: Optional[SpecialIds] = None):
        self.model_bytes = model_bytes
        self.processor = spm.SentencePieceProcessor(model_proto=model_bytes)
        self.piece_count = self.processor.get_piece_size()  # ids below this are sentencepiece's
        self.specials = specials if specials is not None else find_specials(self.processor)
        self.added = check_specials(self.processor, self.specials)  # {id: name} past the pieces

    def __len__(self) -> int:
        """Ids the model needs: the sentencepiece pieces and the added special symbols."""
        return self.piece_count + len(self.added)

    @property
    def never_generated(self) -> Tuple[int, ...]:
        """Ids a search must not produce: padding, a second start, unknown pieces."""
        return (self.specials.pad, self.specials.bos, self.specials.unk)

    def piece_names(self) -> List[str]:
        """Every id's name (the exports' vocabularies): sentencepiece's pieces, then the added symbols."""
        return [self.processor.id_to_piece(i) for i in range(self.piece_count)] + [self.added[i] for i in sorted(self.added)]

    def to_ids(self, sentences: List[str], threads: int = 2) -> List[List[int]]:
        """Token ids without BOS/EOS (the batches add them)."""
        return self.processor.encode(sentences, out_type=int, num_threads=threads)

    def to_sampled_ids(self, sentences: List[str], dropout: float, seed: int) -> List[List[int]]:
        """Token ids of one sampled segmentation (BPE-dropout: each merge skipped with probability
        `dropout`), the same for the same sentences and seed. On one thread: sentencepiece's
        sampling on several threads depends on how it shares out the sentences."""
        spm.set_random_generator_seed(seed)
        return self.processor.encode(sentences, out_type=int, enable_sampling=True, alpha=dropout, nbest_size=-1,
                                     num_threads=1)

    def to_text(self, ids: List[List[int]]) -> List[str]:
        """Text of each id sequence; added symbols are dropped (sentencepiece does not know them)."""
        return self.processor.decode([[i for i in seq if i < self.piece_count] for seq in ids])

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
                pad_id=OUR_LAYOUT.pad,
                unk_id=OUR_LAYOUT.unk,
                bos_id=OUR_LAYOUT.bos,
                eos_id=OUR_LAYOUT.eos,
                num_threads=threads,
                minloglevel=2,
            )
        except RuntimeError as error:
            raise TranslateError(f"sentencepiece training failed: {str(error).splitlines()[0]}") from None
        return cls(model.getvalue(), OUR_LAYOUT)


def find_specials(processor: spm.SentencePieceProcessor) -> SpecialIds:
    """Map our special symbols onto the model's own: its unknown piece, and for pad, bos and eos
    the control piece its trainer named (pad_id, bos_id, eos_id) or, failing that, a control
    piece of the usual name. Never an ordinary or user-defined piece that merely looks like one.
    Symbols it lacks get the ids after its pieces, in the order pad, bos, eos."""
    next_id = processor.get_piece_size()
    found = {"unk": processor.unk_id()}
    for name, trainer_id in (("pad", processor.pad_id()), ("bos", processor.bos_id()), ("eos", processor.eos_id())):
        candidates = (trainer_id, processor.piece_to_id(NAMES[name]))
        found[name] = next((i for i in candidates if i >= 0 and processor.is_control(i)), None)
        if found[name] is None:
            found[name], next_id = next_id, next_id + 1
    return SpecialIds(**found)


def check_specials(processor: spm.SentencePieceProcessor, specials: SpecialIds) -> Dict[int, str]:
    """Check a mapping against its sentencepiece model; returns the added ids and their names
    (the usual name, unless the model has a piece of that name)."""
    pieces, ids = processor.get_piece_size(), specials.as_dict()
    added = sorted((i, name) for name, i in ids.items() if i >= pieces)
    wrong = [f"{name}={i}" for name, i in ids.items() if i < 0 or (i < pieces and not (
        processor.is_unknown(i) if name == "unk" else processor.is_control(i)))]
    if wrong or len(set(ids.values())) < len(ids) or [i for i, _ in added] != list(range(pieces, pieces + len(added))):
        raise TranslateError(f"special ids {ids} do not fit the sentencepiece model of {pieces} pieces"
                             + (f" ({', '.join(wrong)}: not a control or unknown piece)" if wrong else ""))
    taken = {processor.id_to_piece(i) for i in range(pieces)}
    names = {}
    for i, name in added:
        names[i] = NAMES[name]
        while names[i] in taken:  # a piece of the model has that name: ours must differ
            names[i] = names[i].replace(">", "_>")
        taken.add(names[i])
    return names


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
