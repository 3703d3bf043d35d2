"""The preparation of the corpus, which `translate prepare` (verbs/prepare.py) and `translate
train` run: clean the training split, train the joint vocabulary (or take data.spm_model) and
encode the training and dev splits once into the token cache (data.cache), streaming in
chunks; a second run with the same settings finds the cache by its fingerprint and maps it at
once.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Iterator, List, Optional, Set, Tuple

import numpy as np

from translate.core import paths
from translate.core.config import DataConfig
from translate.data.cache import (FORMAT_VERSION, VOCABULARY, PreparedData, SplitWriter, exclusive, file_records,
                                  is_complete, load, sampled_split)
from translate.core.errors import DamagedCache, MissingSplit, TranslateError
from translate.data.loading import ParallelCorpus, load_corpus
from translate.data.progress import Progress
from translate.data.report import DataReport, SplitCounts, TestOverlap
from translate.data.vocabulary import Vocabulary

warn = logging.getLogger(__name__).warning


def fingerprint(data: DataConfig, train: ParallelCorpus, valid: Optional[ParallelCorpus]) -> str:
    """Hash of everything that determines the cache's contents, and nothing else."""
    settings = {
        "format": FORMAT_VERSION,
        "train": train.fingerprint(),
        "valid": valid.fingerprint() if valid is not None else None,
        "src_lang": data.src_lang,
        "tgt_lang": data.tgt_lang,
        "max_length": data.max_length,
        "max_length_ratio": data.max_length_ratio,
    }
    if data.spm_model:  # a given model replaces every vocabulary setting
        model = _read_spm_model(data.spm_model)
        settings["spm_model"] = hashlib.sha256(model).hexdigest()
        settings["specials"] = Vocabulary(model).specials.as_dict()  # how its special pieces are used
    else:
        settings.update(vocab_size=data.vocab_size, vocab_type=data.vocab_type, vocab_sample=data.vocab_sample)
    if data.bpe_dropout:  # only then: the caches of runs without it keep their names
        settings.update(bpe_dropout=data.bpe_dropout, bpe_dropout_copies=data.bpe_dropout_copies)
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def prepare(data: DataConfig, log=print) -> PreparedData:
    """Load the encoded corpus from the cache, building it first if needed: where the cached
    folder is damaged (its files do not match its report), it is rebuilt after a warning that
    names it, since it is derived data and nothing else is trusted."""
    train = load_corpus(data, data.train_split)
    if len(train) == 0:
        raise TranslateError(f"{train.description} is empty")
    valid = _optional_split(data, data.valid_split)
    key = fingerprint(data, train, valid)
    folder = Path(data.cache_dir) / key
    problem = paths.usable_folder(folder)
    if problem:
        raise TranslateError(f"data.cache_dir {data.cache_dir}: {problem}")
    if is_complete(folder):
        try:
            prepared = load(folder)
            log(f"using cached corpus {folder}")
            return prepared
        except DamagedCache as error:
            warn(f"{error}: rebuilding it")
    with exclusive(folder):  # one process builds; the others wait here, then load
        if is_complete(folder):
            try:
                return load(folder)  # another process built it meanwhile
            except DamagedCache:
                pass
        log(f"preparing {train.description}: {len(train):,} pairs -> {folder}")
        _build(folder, data, train, valid, log)
    return load(folder)


def write_report(data: PreparedData, destination: Path) -> None:
    """The data report (pairs kept and dropped, tokens, vocabulary), written atomically."""
    with paths.atomic_write(destination) as file:
        file.write(data.report.text() + "\n")


def _optional_split(data: DataConfig, split: str) -> Optional[ParallelCorpus]:
    """The split if the data has it (dev and test sets are optional for training)."""
    try:
        return load_corpus(data, split)
    except MissingSplit:
        return None


def _read_spm_model(path: str) -> bytes:
    file = Path(path)
    if not file.is_file():
        raise TranslateError(f"missing sentencepiece model: {path}")
    return file.read_bytes()


def _build(folder: Path, data: DataConfig, train: ParallelCorpus, valid: Optional[ParallelCorpus], log) -> None:
    """Build the cache in a staging folder beside `folder`, swapped in whole (over a damaged or
    stale folder of that name), once the staging folders of builds killed part-way are gone; an operating-system error (a full disk, a file-size limit) is
    one line, and nothing of the staging folder is kept."""
    removed = paths.remove_unfinished_folders(folder)
    if removed:
        warn(f"removed what a preparation killed part-way left beside {folder}: {', '.join(removed)}")
    with paths.atomic_folder(folder, "the token cache") as staging:
        report = _encode_splits(staging, data, train, valid, log)
        report.save(staging)  # last: marks the folder complete
    log(report.summary())


def _encode_splits(staging: Path, data: DataConfig, train: ParallelCorpus, valid: Optional[ParallelCorpus],
                   log) -> DataReport:
    """The vocabulary and the encoded training and dev splits in `staging`; returns their report."""
    if data.spm_model:
        vocabulary = Vocabulary(_read_spm_model(data.spm_model))
    else:
        vocabulary = Vocabulary.train(_both_sides(train), data.vocab_size, data.vocab_type, sample_size=data.vocab_sample)
    (staging / VOCABULARY).write_bytes(vocabulary.model_bytes)
    dtype = np.dtype(np.uint16 if len(vocabulary) <= np.iinfo(np.uint16).max else np.int32)
    test = _optional_split(data, "test")
    test_sets = _sentence_sets(test) if test is not None else None
    counts, (source, target), sampled = _encode(train, vocabulary, staging, "train", dtype, data, clean=True,
                                                test_sets=test_sets, log=log)
    if counts.kept == 0:
        raise TranslateError(f"{train.description}: no pair left after cleaning")
    valid_counts = _encode(valid, vocabulary, staging, "valid", dtype, data, clean=False)[0] if valid is not None else None
    overlap = TestOverlap(sentences=len(test), source=source, target=target) if test_sets is not None else None
    unknown, tokens = counts.unk_src + counts.unk_tgt, counts.tokens_src + counts.tokens_tgt
    return DataReport(vocab_size=len(vocabulary), specials=vocabulary.specials.as_dict(), dtype=dtype.name,
                      settings=asdict(data), train=counts, valid=valid_counts, coverage=1 - unknown / max(1, tokens),
                      test_overlap=overlap, sampled=sampled, files=file_records(staging))


def _both_sides(corpus: ParallelCorpus) -> Iterator[str]:
    for src, tgt in corpus.chunks():
        yield from itertools.chain.from_iterable(zip(src, tgt))


def _sentence_sets(corpus: ParallelCorpus) -> Tuple[Set[str], Set[str]]:
    sources, targets = corpus.pairs()
    return {s.strip() for s in sources}, {t.strip() for t in targets}


def _encode(
    corpus: ParallelCorpus,
    vocabulary: Vocabulary,
    folder: Path,
    name: str,
    dtype: np.dtype,
    data: DataConfig,
    clean: bool,
    test_sets: Optional[Tuple[Set[str], Set[str]]] = None,
    log=None,
) -> Tuple[SplitCounts, Tuple[int, int], Optional[SplitCounts]]:
    """Encode chunk by chunk into folder/name.*; training pairs with an empty side, a side over
    data.max_length tokens, or sides more than data.max_length_ratio apart are dropped. Returns
    the split's counts, how many of its source and target sentences are in `test_sets`, and, where
    data.bpe_dropout samples the training split (clean=True), the counts of its sampled
    segmentations together (the pairs kept by the deterministic one, in its order)."""
    writer = SplitWriter(folder, name, dtype, vocabulary.specials.unk)
    copies = data.bpe_dropout_copies if clean and data.bpe_dropout else 0
    sampled_writers = [SplitWriter(folder, sampled_split(k), dtype, vocabulary.specials.unk) for k in range(copies)]
    counts = SplitCounts()
    overlap = [0, 0]  # source, target
    progress = Progress(len(corpus), f"encoding {name}", log) if log is not None else None
    for chunk, (src, tgt) in enumerate(corpus.chunks(20000)):
        if test_sets is not None:
            overlap[0] += sum(s.strip() in test_sets[0] for s in src)
            overlap[1] += sum(t.strip() in test_sets[1] for t in tgt)
        src_ids, tgt_ids = vocabulary.to_ids(src), vocabulary.to_ids(tgt)
        counts.pairs += len(src_ids)
        if clean:
            keep = _clean(src_ids, tgt_ids, data, counts)
            src_ids = [ids for ids, k in zip(src_ids, keep) if k]
            tgt_ids = [ids for ids, k in zip(tgt_ids, keep) if k]
        counts.kept += len(src_ids)
        writer.add("src", src_ids)
        writer.add("tgt", tgt_ids)
        if copies:
            kept_src = [s for s, k in zip(src, keep) if k]
            kept_tgt = [t for t, k in zip(tgt, keep) if k]
            for k, sampled_writer in enumerate(sampled_writers):
                seed = 1 + 2 * (chunk * copies + k)  # each chunk, copy and side its own draws, the same every build
                sampled_writer.add("src", vocabulary.to_sampled_ids(kept_src, data.bpe_dropout, seed))
                sampled_writer.add("tgt", vocabulary.to_sampled_ids(kept_tgt, data.bpe_dropout, seed + 1))
        if progress is not None:
            progress.update(counts.pairs - progress.done)
    if progress is not None:
        progress.close()
    for closing in (writer, *sampled_writers):
        closing.close()
    counts.tokens_src, counts.tokens_tgt = writer.tokens["src"], writer.tokens["tgt"]
    counts.unk_src, counts.unk_tgt = writer.unknown["src"], writer.unknown["tgt"]
    sampled = None
    if copies:  # all copies together
        sampled = SplitCounts(pairs=counts.kept * copies, kept=counts.kept * copies,
                              tokens_src=sum(w.tokens["src"] for w in sampled_writers),
                              tokens_tgt=sum(w.tokens["tgt"] for w in sampled_writers),
                              unk_src=sum(w.unknown["src"] for w in sampled_writers),
                              unk_tgt=sum(w.unknown["tgt"] for w in sampled_writers))
    return counts, (overlap[0], overlap[1]), sampled


def _clean(src_ids: List[List[int]], tgt_ids: List[List[int]], data: DataConfig, counts: SplitCounts) -> np.ndarray:
    """Which pairs of a chunk to keep; counts the dropped ones by their first reason."""
    src_len = np.fromiter(map(len, src_ids), dtype=np.int64, count=len(src_ids))
    tgt_len = np.fromiter(map(len, tgt_ids), dtype=np.int64, count=len(tgt_ids))
    empty = (src_len == 0) | (tgt_len == 0)
    too_long = ~empty & (np.maximum(src_len, tgt_len) > data.max_length)
    ratio = np.zeros_like(empty)
    if data.max_length_ratio > 0:
        longer, shorter = np.maximum(src_len, tgt_len), np.maximum(np.minimum(src_len, tgt_len), 1)
        ratio = ~empty & ~too_long & (longer > data.max_length_ratio * shorter)
    counts.empty += int(empty.sum())
    counts.too_long += int(too_long.sum())
    counts.ratio += int(ratio.sum())
    return ~(empty | too_long | ratio)
