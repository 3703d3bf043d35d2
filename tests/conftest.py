"""Shared fixtures: the real data in ../shared/data, shrunk configs, one trained checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, List

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
MULTI30K = SHARED_DATA / "multi30k"
WMT14_MINI = SHARED_DATA / "wmt14-mini"
TEXT = SHARED_DATA / "text"

# A model small enough to train in seconds, on the real Multi30k dev split.
SMALL = [
    "config=tiny",
    f"data.path={MULTI30K}",
    "data.train_split=validation",
    "data.vocab_size=603",  # not a multiple of 8: the embedding is padded (model.vocab_multiple)
    "model.d_model=32",
    "model.d_ff=64",
    "model.heads=2",
    "model.layers=1",
    "optim.warmup_steps=20",
    "train.tokens_per_batch=1500",
    "train.tokens_per_update=1500",
    "train.max_steps=30",
    "train.log_every=10",
]


TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_port() -> int:
    """A TCP port no one listens on now, for a test's own rendezvous."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need(path: Path) -> Path:
    """Skip (with the reason) where the shared data is missing."""
    if not path.exists():
        pytest.skip(f"shared data not found: {path}")
    return path


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one thread is fastest, and immune to a busy machine's contention."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    """One encoded corpus for the tests of a module (each run prepares it otherwise)."""
    need(MULTI30K)
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture
def compose(tmp_path) -> Callable[..., object]:
    """Compose a verb's real config with overrides, writing under tmp_path."""
    from translate.hydra_cli import load_config

    def _compose(verb: str = "train", *overrides: str):
        base = [f"run_dir={tmp_path / 'run'}", f"data.cache_dir={tmp_path / 'cache'}"]
        return load_config(verb, base + list(overrides))

    return _compose


def run_cli(*args: str, cwd: Path = ROOT, check: bool = False, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `python -m translate ARGS` as a user would."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    result = subprocess.run(
        [sys.executable, "-m", "translate", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        raise AssertionError(f"translate {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> List[str]:
    """One small model trained through the CLI, shared by the tests that decode and score.
    Returns the overrides that point the verbs at its run_dir."""
    need(MULTI30K)
    folder = tmp_path_factory.mktemp("trained")
    overrides = SMALL + [f"run_dir={folder / 'run'}", f"data.cache_dir={folder / 'cache'}"]
    run_cli("train", *overrides, check=True)
    return overrides


def train_sentencepiece(path: Path, vocab_size: int = 600, **options) -> Path:
    """A sentencepiece model trained by sentencepiece itself (its defaults unless `options` say
    otherwise: unk 0, bos 1, eos 2, no pad) on Multi30k's dev split, both languages."""
    import io

    import pyarrow.parquet as pq
    import sentencepiece as spm

    table = pq.read_table(need(MULTI30K / "de-en" / "validation-00000-of-00001.parquet"))
    lines = [text for row in table.column("translation").to_pylist() for text in (row["en"], row["de"])]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
                                   minloglevel=2, **options)
    path.write_bytes(model.getvalue())
    return path


@pytest.fixture(scope="session")
def default_spm_model(tmp_path_factory) -> Path:
    """A sentencepiece model with sentencepiece's default layout (unk 0, bos 1, eos 2, no pad)."""
    return train_sentencepiece(tmp_path_factory.mktemp("spm") / "default.model")


@pytest.fixture(scope="session")
def foreign_run(tmp_path_factory, default_spm_model) -> List[str]:
    """A small model on a sentencepiece model of sentencepiece's own layout (pad added after its
    pieces: 601 ids, padded to 608 rows), trained through the CLI long enough to end most
    greedy translations of Multi30k's test split before the length cap, with two numbered
    checkpoints that decode averages. Returns the overrides that point the verbs at it."""
    folder = tmp_path_factory.mktemp("foreign")
    small = [o for o in SMALL if not o.startswith(("train.max_steps=", "train.log_every=", "optim.warmup_steps="))]
    overrides = small + [f"data.spm_model={default_spm_model}", "train.max_steps=700", "optim.warmup_steps=200", "train.log_every=100",
                         "checkpoint.every_steps=50", "checkpoint.average_last=2", "train.threads=1",
                         f"run_dir={folder / 'run'}", f"data.cache_dir={folder / 'cache'}"]
    run_cli("train", *overrides, check=True)
    return overrides


def run_dir_of(overrides: List[str]) -> Path:
    return Path(next(o for o in overrides if o.startswith("run_dir=")).split("=", 1)[1])


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_stay_in_pytest_tmp(tmp_path_factory):
    """torchrun and other subprocesses write temporary folders (torchelastic_*) under TMPDIR:
    keep them with pytest's own, instead of leaving them in /tmp after every run."""
    import tempfile

    previous = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("tmp"))
    tempfile.tempdir = None  # recomputed from TMPDIR
    yield
    if previous is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = previous
    tempfile.tempdir = None
