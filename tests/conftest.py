"""Shared fixtures and helpers: the real data in ../shared/data, shrunk configs, trained
checkpoints, and the one way each of these is done: run a command (`run`, `run_cli`), find a
run's folder (`run_dir_of`), check a clear failure (`one_line_error`)."""

from __future__ import annotations

import atexit
import importlib.util
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import pytest

# Two pytest-xdist workers share two cores, each starting processes of two threads: OpenMP's
# spinning waits would take the cores the other's threads need (scripts/bench_contention.py:
# 0.08x the quiet speed beside a training). Sleeping waits, in this process and its children.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# No core files from the commands run() aborts for their stacks (SIGABRT) past a timeout.
resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))

# Every test process (each xdist worker) and every command a test runs starts from a home of its
# own, empty: the caches found there (Hugging Face's, where `datasets` writes a data set's Arrow
# files the first time it loads it; matplotlib's fonts; torch's) are what this session made, as
# on a machine that never ran the project, and never what an earlier run or the user left. Set
# here, before any test imports `datasets`, which reads its cache folder once.
FRESH_HOME = Path(tempfile.mkdtemp(prefix="translate-tests-home-"))
atexit.register(shutil.rmtree, FRESH_HOME, ignore_errors=True)
for _name in ("HF_HOME", "HF_DATASETS_CACHE", "HF_HUB_CACHE", "TRANSFORMERS_CACHE", "TORCH_HOME", "MPLCONFIGDIR",
              "XDG_CONFIG_HOME"):
    os.environ.pop(_name, None)  # each would point past the fresh home
os.environ.update(HOME=str(FRESH_HOME), XDG_CACHE_HOME=str(FRESH_HOME / ".cache"))

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
    # fp32 where auto would pick bf16 (CPUs with AMX or AVX512-BF16): the tests compare runs
    # and processes at fp32's tolerances, and bf16's compiled products cost each short process.
    "train.precision=fp32",
    "train.max_steps=30",
    "train.log_every=10",
]
FEW = SMALL[:-2] + ["train.max_steps=2", "train.log_every=1"]  # two updates
# Runs that are stopped and resumed: a log line each update, a checkpoint every 5, no validation.
RESUMABLE = ["train.log_every=1", "checkpoint.every_steps=5", "checkpoint.every_minutes=null", "valid.every_steps=0"]

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def script_module(name: str):
    """scripts/NAME.py loaded as a module, for a test of its functions (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


# Commands.


def cli(*args: str) -> List[str]:
    """The command line of `translate ARGS`."""
    return [sys.executable, "-m", "translate", *args]


def torchrun(*args: str, processes: int = 2) -> List[str]:
    """The command line of `translate ARGS` in `processes` processes on this machine under
    torchrun, with a rendezvous port of its own."""
    return [*TORCHRUN, f"--nproc_per_node={processes}", f"--master_port={free_port()}", "-m", "translate", *args]


def start(command: Sequence[str], env=None, **options) -> subprocess.Popen:
    """Start `command` in the repository, in a session of its own (so that all of its processes
    can be ended together), unbuffered, its output captured as text unless `options` say
    otherwise (subprocess.Popen's)."""
    options = dict(dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), **options)
    # faulthandler: a process sent SIGABRT writes every thread's Python stack first (run's timeout).
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
    return subprocess.Popen(list(command), cwd=ROOT, env=env, start_new_session=True, **options)


def run(command: Sequence[str], *, env=None, timeout: float = 600, check: bool = False, input=None,
        **options) -> subprocess.CompletedProcess:
    """Run `command` to its end (see start); past `timeout` every process it started is killed,
    and the test fails with the end of their output: each one's Python stacks, which it writes
    when sent SIGABRT first (a hang shows where it waited). With check, a non-zero exit fails the
    test, showing the output. `input` (str, or bytes for binary output) goes to its standard input."""
    if input is not None:
        options = dict(dict(stdin=subprocess.PIPE, text=not isinstance(input, bytes)), **options)
    process = start(command, env=env, **options)
    try:
        stdout, stderr = process.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        processes = [*reversed(descendants(process.pid)), process.pid]  # torchrun's workers have sessions of their own
        for sig in (signal.SIGABRT, signal.SIGKILL):  # the workers' stacks, then the launcher's; then the end
            for pid in processes:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(3 if sig == signal.SIGABRT else 0)
        stdout, stderr = process.communicate(timeout=60)
        # Both streams: a caller may have sent stderr into stdout (stderr=subprocess.STDOUT).
        output = "".join(o.decode(errors="replace") if isinstance(o, bytes) else o for o in (stdout, stderr) if o)
        raise AssertionError(f"{' '.join(map(str, command))} did not end within {timeout:g} s; the end of its "
                             f"output, with each process's stacks:\n{output[-12000:]}") from None
    result = subprocess.CompletedProcess(list(command), process.returncode, stdout, stderr)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, command))} failed ({result.returncode}):\n{stdout}\n{stderr}")
    return result


def descendants(pid: int) -> List[int]:
    """The processes that `pid` started, and theirs (Linux: read from /proc)."""
    children: Dict[int, List[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # ended meanwhile
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, waiting = [], [pid]
    while waiting:
        for child in children.get(waiting.pop(), []):
            found.append(child)
            waiting.append(child)
    return found


def run_cli(*args: str, **options) -> subprocess.CompletedProcess:
    """Run `translate ARGS` as a user would (options: run's: env=, timeout=, check=, input=, ...)."""
    return run(cli(*args), **options)


def hook_env(tmp_path: Path, code: str = "", blocked: Sequence[str] = (), **variables: str) -> Dict[str, str]:
    """An environment whose Python runs `code` at start-up (a sitecustomize of this test's own),
    in which each package of `blocked` fails to import, as if not installed, with `variables`."""
    folder = tmp_path / "hook"
    folder.mkdir(exist_ok=True)
    if code:
        (folder / "sitecustomize.py").write_text(code, encoding="utf-8")
    for package in blocked:
        (folder / package).mkdir(exist_ok=True)
        (folder / package / "__init__.py").write_text("raise ImportError('not installed')\n", encoding="utf-8")
    return dict(os.environ, PYTHONPATH=f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **variables)


def in_update(update: int, action: str, rank: Optional[int] = None) -> str:
    """Start-up code (for hook_env) that runs `action`, Python statements, at the start of the
    `update`-th update's forward and backward pass (translate.training.trainer.train_step), in
    every process, or in process `rank` of a torchrun job alone."""
    import textwrap

    body = textwrap.indent(textwrap.dedent(action).strip(), " " * 12)
    guard = f"os.environ.get('RANK') == '{rank}'" if rank is not None else "True"
    return (f"import os, signal, time\nif {guard}:\n    import translate.training.trainer as t\n"
            f"    original, calls = t.train_step, []\n    def hooked(*args, **kwargs):\n        calls.append(1)\n"
            f"        if len(calls) == {update}:\n{body}\n        return original(*args, **kwargs)\n"
            f"    t.train_step = hooked\n")


def wait_for(path: Path, timeout: float = 300) -> None:
    """Until `path` exists (a checkpoint a running training writes), at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def gloo_pair(worker: Callable, overrides: List[str]):
    """Run worker(rank, port, overrides, results) in two spawned processes (rank 0 and 1, a
    rendezvous port of their own): what rank 0 puts in results."""
    import torch.multiprocessing as mp

    results = mp.get_context("spawn").Queue()
    mp.start_processes(worker, args=(free_port(), overrides, results), nprocs=2, join=True, start_method="spawn")
    return results.get(timeout=60)


# Checks.


def one_line_error(result: subprocess.CompletedProcess, *fragments: str, logs: bool = False) -> None:
    """Exit 1, no traceback, and the problem in one `translate VERB: error:` line holding every
    fragment: the whole of stderr, or with logs, its last line after translate's own log lines."""
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    if logs:  # progress log lines (`[...][translate.data.preparation][INFO] - ...`) may come first
        assert all("][translate." in line for line in lines[:-1]), result.stderr
        lines = lines[-1:]
    assert len(lines) == 1 and ": error: " in lines[0], result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# Runs.


def run_dir_of(overrides: List[str]) -> Path:
    """The run_dir that these overrides name."""
    return Path(next(o for o in overrides if o.startswith("run_dir=")).split("=", 1)[1])


def small_run(tmp_path: Path, *extra: str, folder: str = "run") -> List[str]:
    """The overrides of a SMALL model trained in tmp_path/FOLDER, its cache in tmp_path/cache:
    SMALL without its number of updates and logging period (`extra` may give them)."""
    return SMALL[:-2] + [*extra, f"run_dir={tmp_path / folder}", f"data.cache_dir={tmp_path / 'cache'}"]


def train_resumable(tmp_path: Path, folder: str, *extra: str, env=None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`translate train` of a RESUMABLE small model in tmp_path/FOLDER, with `extra` overrides."""
    return run_cli("train", *small_run(tmp_path, *RESUMABLE, *extra, folder=folder), env=env, timeout=timeout)


def noam(step: int, d_model: int = 512, warmup: int = 4000, scale: float = 1.0) -> float:
    """The paper's formula (section 5.3), written out again as the reference."""
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def write_pairs(folder: Path, name: str, pairs: List[Tuple[str, str]]) -> None:
    """A plain-text corpus: folder/NAME.en and folder/NAME.de, a pair a line."""
    (folder / f"{name}.en").write_text("".join(p[0] + "\n" for p in pairs), encoding="utf-8")
    (folder / f"{name}.de").write_text("".join(p[1] + "\n" for p in pairs), encoding="utf-8")


def corpus_with_noise(tmp_path: Path) -> List[Tuple[str, str]]:
    """Real Multi30k pairs (the dev split, returned) plus one empty, one over-long and one badly
    proportioned pair, as tmp_path/train.{en,de}; its first 20 pairs as tmp_path/test.{en,de}."""
    need(MULTI30K)
    import datasets

    rows = datasets.load_dataset(str(MULTI30K), "de-en", split="validation")["translation"]
    pairs = [(r["en"], r["de"]) for r in rows]
    noise = [("", "Ein Hund."), (" ".join(["word"] * 300), "Wort."), ("A dog.", " ".join(["Hund"] * 40))]
    write_pairs(tmp_path, "train", pairs[:500] + noise + pairs[500:])
    write_pairs(tmp_path, "test", pairs[:20])
    return pairs


def multi30k_test(count: int) -> Tuple[List[str], List[str]]:
    """The first `count` (English, German) pairs of Multi30k's test split (test_2016_flickr)."""
    import pyarrow.parquet as pq

    table = pq.read_table(need(MULTI30K / "de-en" / "test-00000-of-00001.parquet")).slice(0, count)
    pairs = [row["translation"] for row in table.to_pylist()]
    return [p["en"] for p in pairs], [p["de"] for p in pairs]


# Fixtures.


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


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """A folder that `build` fills once per test session, for all its workers (the first to need
    it builds it, the others wait for it), copied into this worker's own temporary folder: what
    a test changes in its copy, no other worker sees."""
    import fcntl
    import shutil

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # pytest-N, above popen-gwN
    built = shared / f"built-{name}"
    with open(shared / f"built-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed, or with its process
        if not (built / ".complete").exists():
            shutil.rmtree(built, ignore_errors=True)
            built.mkdir()
            build(built)
            (built / ".complete").touch()
    copy = tmp_path_factory.mktemp(name)
    shutil.copytree(built, copy, dirs_exist_ok=True)
    return copy


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> List[str]:
    """One small model trained through the CLI, shared by the tests that decode and score.
    Returns the overrides that point the verbs at its run_dir."""
    need(MULTI30K)

    def overrides(folder: Path) -> List[str]:
        return SMALL + [f"run_dir={folder / 'run'}", f"data.cache_dir={folder / 'cache'}"]

    return overrides(built_once(tmp_path_factory, "trained", lambda folder: run_cli("train", *overrides(folder), check=True)))


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
def foreign_run(tmp_path_factory) -> List[str]:
    """A small model on a sentencepiece model of sentencepiece's own layout (pad added after its
    pieces: 601 ids, padded to 608 rows), trained through the CLI long enough to end most
    greedy translations of Multi30k's test split before the length cap (250 updates at twice
    the rate: all 1,000 end, as 790 did after 700 at the plain rate, in 12 s instead of 24 on a
    Zen 3), with two numbered checkpoints that decode averages. Returns the overrides that
    point the verbs at it."""
    small = [o for o in SMALL if not o.startswith(("train.max_steps=", "train.log_every=", "optim.warmup_steps="))]

    def overrides(folder: Path) -> List[str]:
        return small + [f"data.spm_model={folder / 'default.model'}", "train.max_steps=250", "optim.warmup_steps=80",
                        "optim.lr_scale=2",
                        "train.log_every=100", "checkpoint.every_steps=50", "checkpoint.average_last=2", "train.threads=1",
                        f"run_dir={folder / 'run'}", f"data.cache_dir={folder / 'cache'}"]

    def build(folder: Path) -> None:
        train_sentencepiece(folder / "default.model")  # as default_spm_model is
        run_cli("train", *overrides(folder), check=True)

    return overrides(built_once(tmp_path_factory, "foreign", build))


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


def greedy_reference(step, state, max_lengths: Sequence[int], symbols) -> List[List[int]]:
    """The reference the searches are checked against, written out independently of
    translate.search: the most probable token at each step (never one of symbols.banned), until
    EOS or the length limit (EOS included)."""
    import torch

    outputs: List[List[int]] = [[] for _ in max_lengths]
    last = torch.full((len(max_lengths),), symbols.bos)
    finished = [False] * len(max_lengths)
    for t in range(max(max_lengths)):
        with torch.no_grad():
            log_probs = step(last, state).clone()
        log_probs[:, list(symbols.banned)] = float("-inf")
        last = log_probs.argmax(dim=-1)
        for b, token in enumerate(last.tolist()):
            if not finished[b]:
                finished[b] = token == symbols.eos or t + 1 >= max_lengths[b]
                if not finished[b]:
                    outputs[b].append(token)
        if all(finished):
            break
    return outputs
