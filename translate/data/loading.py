"""Parallel corpora: a `datasets` split (hub id or local folder of the same layout) or two
aligned plain-text files. Both stream sentence pairs in chunks and carry a fingerprint."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

from translate.core.config import DataConfig
from translate.core.errors import MissingSplit, TranslateError, first_line, os_error_in, root_cause
from translate.core.paths import PROJECT_ROOT

Chunk = Tuple[List[str], List[str]]  # (source sentences, target sentences), aligned

log = logging.getLogger(__name__)

# How long the hub may take to answer before loading goes to datasets' cache alone: long
# enough for a slow link, short beside huggingface_hub's retries (five, with backoff).
HUB_PROBE_SECONDS = 5.0


class ParallelCorpus:
    """Aligned source/target sentences of one split."""

    description: str

    def __len__(self) -> int:
        raise NotImplementedError

    def chunks(self, size: int = 10000) -> Iterator[Chunk]:
        """Yield (sources, targets) lists of at most `size` pairs, in corpus order."""
        raise NotImplementedError

    def fingerprint(self) -> str:
        """Changes whenever the underlying data changes."""
        raise NotImplementedError

    def pairs(self) -> Chunk:
        """All pairs at once (small splits: test and dev sets)."""
        sources: List[str] = []
        targets: List[str] = []
        for src, tgt in self.chunks():
            sources.extend(src)
            targets.extend(tgt)
        return sources, targets


@dataclass
class HubCorpus(ParallelCorpus):
    """One split of a `datasets` dataset: a `translation` dict column or one column per language."""

    dataset: "object"  # datasets.Dataset
    src_lang: str
    tgt_lang: str
    description: str

    def __len__(self) -> int:
        return len(self.dataset)

    def chunks(self, size: int = 10000) -> Iterator[Chunk]:
        columns = self.dataset.column_names
        for batch in self.dataset.iter(batch_size=size):
            if "translation" in columns:
                pairs = batch["translation"]
                try:
                    src = [pair[self.src_lang] for pair in pairs]
                    tgt = [pair[self.tgt_lang] for pair in pairs]
                except (KeyError, TypeError):
                    raise TranslateError(
                        f"{self.description}: a 'translation' entry lacks '{self.src_lang}' or '{self.tgt_lang}'"
                    ) from None
            else:
                src, tgt = batch[self.src_lang], batch[self.tgt_lang]
            yield [s or "" for s in src], [t or "" for t in tgt]

    def fingerprint(self) -> str:
        """The files `datasets` serves the split from (their names carry its hash of the source
        data and of the builder's settings) with their sizes; a dataset held in memory hashes
        its rows instead."""
        digest = hashlib.sha256(f"{self.src_lang}-{self.tgt_lang}:{len(self.dataset)}".encode())
        files = [Path(entry["filename"]) for entry in self.dataset.cache_files]
        for path in files:
            digest.update(f"|{path.resolve()}:{path.stat().st_size}".encode())
        if not files:
            for chunk in self.chunks():
                digest.update(json.dumps(chunk, ensure_ascii=False).encode())
        return digest.hexdigest()


@dataclass
class TextCorpus(ParallelCorpus):
    """Two plain-text files, line i of one the translation of line i of the other."""

    src_path: Path
    tgt_path: Path
    description: str

    def __post_init__(self) -> None:
        for path in (self.src_path, self.tgt_path):
            if not path.is_file():
                raise TranslateError(f"missing file: {path}")
        self._length = _count_lines(self.src_path)
        tgt_length = _count_lines(self.tgt_path)
        if self._length != tgt_length:
            raise TranslateError(
                f"misaligned corpus: {self.src_path} has {self._length} lines but "
                f"{self.tgt_path} has {tgt_length}"
            )

    def __len__(self) -> int:
        return self._length

    def chunks(self, size: int = 10000) -> Iterator[Chunk]:
        with open(self.src_path, "rb") as src_file, open(self.tgt_path, "rb") as tgt_file:
            src_lines: List[str] = []
            tgt_lines: List[str] = []
            for line_number, (src, tgt) in enumerate(zip(src_file, tgt_file), 1):
                src_lines.append(text_line(src, self.src_path, line_number))
                tgt_lines.append(text_line(tgt, self.tgt_path, line_number))
                if len(src_lines) == size:
                    yield src_lines, tgt_lines
                    src_lines, tgt_lines = [], []
            if src_lines:
                yield src_lines, tgt_lines

    def fingerprint(self) -> str:
        parts = []
        for path in (self.src_path, self.tgt_path):
            stat = path.stat()
            parts.append(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}")
        return hashlib.sha256("|".join(parts).encode()).hexdigest()


def _count_lines(path: Path) -> int:
    count = 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            count += block.count(b"\n")
        if handle.tell() and not _ends_with_newline(path):
            count += 1
    return count


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"


def text_line(raw: bytes, path: Path, line_number: int) -> str:
    """One line of a file as text, without its line end (\n or \r\n)."""
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise TranslateError(f"{path}:{line_number}: invalid UTF-8") from None


def read_lines(path: str) -> List[str]:
    """A text file's lines (decode input, BLEU hypotheses and references)."""
    file = Path(path)
    if not file.is_file():
        raise TranslateError(f"missing file: {path}")
    with open(file, "rb") as handle:
        return [text_line(raw, file, n) for n, raw in enumerate(handle, 1)]


def local_or_hub(local: str, hub: str) -> str:
    """${local_or_hub:} in configs/data: a local dataset folder when it exists (relative to the
    cwd or the project), else a hub id."""
    for candidate in (Path(local), PROJECT_ROOT / local):
        if candidate.is_dir():
            return str(candidate)
    return hub


def if_local(path: Optional[str], name: str) -> Optional[str]:
    """${if_local:} in configs/data: the hub config name for a local folder; hub copies such as
    bentrevett/multi30k have none."""
    return name if path and Path(path).is_dir() else None


# Split names that map onto the text group's prefixes.
_TEXT_SPLITS = {"train": "train", "validation": "valid", "valid": "valid", "dev": "valid", "test": "test"}


@dataclass
class LowercasedCorpus(ParallelCorpus):
    """Another corpus with both sides lowercased (data.lowercase): Wu et al. (2021) and much of the
    Multi30k literature train and score on lowercased text."""

    corpus: ParallelCorpus

    @property
    def description(self) -> str:  # type: ignore[override]
        return f"{self.corpus.description}, lowercased"

    def __len__(self) -> int:
        return len(self.corpus)

    def chunks(self, size: int = 10000) -> Iterator[Chunk]:
        for src, tgt in self.corpus.chunks(size):
            yield [s.lower() for s in src], [t.lower() for t in tgt]

    def fingerprint(self) -> str:
        return hashlib.sha256(f"lowercased:{self.corpus.fingerprint()}".encode()).hexdigest()


def load_corpus(data: DataConfig, split: str) -> ParallelCorpus:
    """The named split of the configured corpus (hub/local dataset or text prefix), lowercased
    where data.lowercase says so."""
    if data.train is not None or data.path is None:
        corpus = _load_text(data, split)
    else:
        corpus = _load_dataset_split(data, split)
    return LowercasedCorpus(corpus) if data.lowercase else corpus


def _load_text(data: DataConfig, split: str) -> ParallelCorpus:
    key = _TEXT_SPLITS.get(split)
    if key is None:
        raise TranslateError(f"unknown split '{split}' for plain text data (use train, validation or test)")
    prefix: Optional[str] = getattr(data, key)
    if prefix is None:
        raise MissingSplit(f"no files for split '{split}': set data.{key}=PREFIX")
    return TextCorpus(
        Path(f"{prefix}.{data.src_lang}"),
        Path(f"{prefix}.{data.tgt_lang}"),
        description=f"{prefix}.{{{data.src_lang},{data.tgt_lang}}}",
    )


def _load_dataset_split(data: DataConfig, split: str) -> ParallelCorpus:
    import datasets
    import huggingface_hub

    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    huggingface_hub.utils.logging.set_verbosity_error()  # its retry warnings, a line each try
    description = f"dataset '{data.path}'" + (f" ({data.name})" if data.name else "")
    # A hub id is "owner/name"; anything else that does not exist is a missing local folder.
    looks_local = data.path.startswith((".", "/", "~")) or data.path.count("/") > 1
    if looks_local and not Path(data.path).expanduser().exists():
        raise TranslateError(f"missing data path: {data.path}")
    offline = None if Path(data.path).expanduser().exists() else _hub_offline()
    try:
        with _offline_mode(offline is not None):
            dataset = datasets.load_dataset(data.path, data.name, split=split)
    except ValueError as error:
        message = str(error).splitlines()[0]
        if "split" in message.lower():
            raise MissingSplit(f"{description} has no split '{split}': {message}") from None
        raise TranslateError(f"cannot load {description}: {_load_failure(error, offline)}") from None
    except Exception as error:  # network, missing hub id, bad config name, a full disk: all user-facing
        raise TranslateError(f"cannot load {description}: {_load_failure(error, offline)}") from None
    if offline is not None:
        _loaded_from_cache(description, offline)
    columns = dataset.column_names
    if "translation" not in columns and not {data.src_lang, data.tgt_lang} <= set(columns):
        raise TranslateError(
            f"{description} split '{split}' has columns {columns}: expected 'translation' "
            f"or '{data.src_lang}' and '{data.tgt_lang}'"
        )
    return HubCorpus(dataset, data.src_lang, data.tgt_lang, description=f"{description} split '{split}'")


def _hub_offline() -> Optional[str]:
    """Why a hub id is loaded from datasets' cache alone (the user's offline mode, or a hub that
    does not answer), or None where the hub is asked."""
    import datasets

    if datasets.config.HF_HUB_OFFLINE:
        return "offline mode is on (HF_HUB_OFFLINE)"
    if not _hub_answers(datasets.config.HF_ENDPOINT):
        return f"the Hugging Face Hub ({datasets.config.HF_ENDPOINT}) cannot be reached"
    return None


@functools.lru_cache(maxsize=None)
def _hub_answers(endpoint: str) -> bool:
    """Whether the hub answers one request within HUB_PROBE_SECONDS, with any status: without
    it, each file datasets asks for would wait out huggingface_hub's retries. The request goes
    through huggingface_hub's own session (its proxies, certificates and headers)."""
    from huggingface_hub.utils import get_session

    session = get_session()
    try:
        session.head(endpoint, timeout=HUB_PROBE_SECONDS)
    except OSError:  # requests' connection, timeout, proxy and TLS errors (RequestException)
        return False
    return True


@functools.lru_cache(maxsize=None)
def _loaded_from_cache(description: str, offline: str) -> None:
    """Says once per dataset, not per split, that its splits come from datasets' cache and why."""
    log.info("%s: loaded from datasets' cache (%s)", description, offline)


@contextlib.contextmanager
def _offline_mode(offline: bool) -> Iterator[None]:
    """datasets' and huggingface_hub's offline mode (what HF_HUB_OFFLINE sets when they are
    imported) for the time of one load: a hub id then comes from datasets' cache at once."""
    import datasets
    import huggingface_hub

    settings = [(datasets.config, "HF_HUB_OFFLINE"), (huggingface_hub.constants, "HF_HUB_OFFLINE")]
    saved = [getattr(module, name) for module, name in settings]
    if offline:
        for module, name in settings:
            setattr(module, name, True)
    try:
        yield
    finally:
        for (module, name), value in zip(settings, saved):
            setattr(module, name, value)


def _load_failure(error: Exception, offline: Optional[str]) -> str:
    """Why a load failed, in words the user can act on: where the hub was out of reach (or
    offline mode set), that datasets' cache holds no copy and how to give a local one."""
    import datasets

    if offline is None and isinstance(error, ConnectionError):  # the hub stopped answering mid-way
        offline = f"the Hugging Face Hub ({datasets.config.HF_ENDPOINT}) cannot be reached"
    # Offline, datasets says "Couldn't reach" (ConnectionError) where the cache has no copy of the
    # dataset and "Couldn't find cache" (ValueError) where it has none of this config.
    if offline is None or not isinstance(error, (ConnectionError, ValueError)):
        return _with_cause(error)
    return (f"{offline}, and datasets' cache ({datasets.config.HF_DATASETS_CACHE}) holds no copy of it: "
            f"give a local copy with data.path=DIR (docs/data.md)")


def _with_cause(error: Exception) -> str:
    """`datasets`' message and, where it wraps another error, the root cause; an error of the
    operating system's without a path of its own (a full disk) is placed in datasets' cache
    folder, where it writes a dataset's Arrow files the first time it loads it."""
    import datasets

    message = first_line(error).rstrip(".")
    cause = root_cause(error)
    if cause not in message:
        message = f"{message}: {cause}"
    failed = os_error_in(error)
    # errno: a system call failed; library errors that subclass OSError (ConnectionError,
    # huggingface_hub's LocalEntryNotFoundError) carry none and wrote nothing.
    if failed is not None and failed.errno is not None and not failed.filename:
        message += f" (writing its Arrow cache in {datasets.config.HF_DATASETS_CACHE})"
    return message
