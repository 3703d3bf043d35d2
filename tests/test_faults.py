"""Faults from outside, injected into the verbs as a user meets them: a file-size limit (a full
disk), a folder in the way that is a file, a token cache damaged after it was built, damaged
parts of a checkpoint, errors of the operating system anywhere, and an unexpected error. Each
is one line and a non-zero exit, no traceback, and nothing damaged or half-written is trusted
afterwards."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path
from typing import Dict

import pytest
import torch

from tests.conftest import FRESH_HOME, MULTI30K, SMALL, hook_env, need, one_line_error, run_cli, run_dir_of
from translate.core.errors import first_line, headline

# The small model's data, without the training settings: prepare and the cache tests need no more.
DATA = [o for o in SMALL if o.startswith(("config=", "data."))]


FILE_SIZE_LIMIT = """
import resource
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))  # what a full disk looks like to one file
"""


def digests(folder: Path) -> Dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# --- the file system ---------------------------------------------------------------------------


def test_sessions_start_from_an_empty_home():
    """Every run of the suite runs as on a machine that never ran the project: the Hugging Face
    cache that `datasets` reads and writes is inside this session's own fresh home."""
    import datasets.config

    assert Path.home() == FRESH_HOME and Path(datasets.config.HF_DATASETS_CACHE).is_relative_to(FRESH_HOME)


def test_prepare_under_a_file_size_limit_keeps_nothing_and_the_next_run_prepares(tmp_path):
    need(MULTI30K)
    cache = tmp_path / "cache"
    args = ["prepare", *DATA, f"data.cache_dir={cache}", f"run_dir={tmp_path}/run"]
    # datasets' own Arrow cache first (a fresh home has none): the limit then meets our token cache.
    assert run_cli("prepare", *DATA, f"data.cache_dir={tmp_path}/warm", f"run_dir={tmp_path}/warm").returncode == 0
    result = run_cli(*args, env=hook_env(tmp_path, FILE_SIZE_LIMIT.format(limit=20_000)))
    one_line_error(result, f"cannot write the token cache {cache}/", "File too large", "nothing of it was kept", logs=True)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []  # no staging folder, no cache
    assert run_cli(*args).returncode == 0
    assert len(list(cache.glob("*/report.json"))) == 1


def test_a_full_disk_under_datasets_own_cache_names_the_cause_and_the_folder(tmp_path):
    """On a machine whose datasets cache is empty, `datasets` writes a data set's Arrow files
    before our token cache: where that write fails, the one line says why and where (it said
    "An error occurred while generating the dataset" alone)."""
    need(MULTI30K)
    empty = tmp_path / "hf-datasets"
    env = hook_env(tmp_path, FILE_SIZE_LIMIT.format(limit=20_000), HF_DATASETS_CACHE=str(empty))
    result = run_cli("prepare", *DATA, f"data.cache_dir={tmp_path}/cache", f"run_dir={tmp_path}/run", env=env)
    one_line_error(result, "cannot load dataset", "File too large", str(empty), logs=True)


@pytest.mark.parametrize("verb, setting", [("train", "run_dir"), ("train", "data.cache_dir"),
                                           ("decode", "decode.output"), ("export", "export.output")])
def test_a_file_where_a_folder_should_be_is_named(tmp_path, trained_run, verb, setting):
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("not a folder\n")
    target = in_the_way / "below"
    overrides = [o for o in trained_run if not o.startswith(f"{setting}=")] + [f"{setting}={target}"]
    result = run_cli(verb, *overrides, "train.max_steps=1")
    one_line_error(result, str(target), f"{in_the_way} is a file, not a folder", logs=True)
    assert in_the_way.read_text() == "not a folder\n"


def test_a_decode_output_that_cannot_be_written_leaves_the_previous_one(tmp_path, trained_run):
    source, output = tmp_path / "in.en", tmp_path / "out.de"
    source.write_text("A man in a blue shirt is standing on a ladder.\n" * 6000, encoding="utf-8")
    quick = [f"decode.input={source}", f"decode.output={output}", "decode.beam_size=1", "decode.max_len_a=0",
             "decode.max_len_b=10"]  # short greedy outputs: the file, not the search, is what is tested
    assert run_cli("decode", *trained_run, *quick).returncode == 0
    before = output.read_bytes()
    assert len(before) > 30_000  # larger than the limit below, which Hydra's own files stay under
    result = run_cli("decode", *trained_run, *quick, env=hook_env(tmp_path, FILE_SIZE_LIMIT.format(limit=30_000)))
    one_line_error(result, f"cannot write {output}", "File too large", "the previous out.de is intact", logs=True)
    assert output.read_bytes() == before and [p.name for p in tmp_path.glob(".out.de*")] == []


def test_an_export_that_cannot_be_written_leaves_the_previous_one(tmp_path, trained_run):
    folder = tmp_path / "ct2"
    assert run_cli("export", *trained_run, f"export.output={folder}").returncode == 0
    before = digests(folder)
    result = run_cli("export", *trained_run, f"export.output={folder}",
                     env=hook_env(tmp_path, FILE_SIZE_LIMIT.format(limit=50_000)))
    one_line_error(result, f"cannot write the export {folder}", "File too large", "the previous one is intact")
    assert digests(folder) == before and sorted(p.name for p in tmp_path.iterdir()) == ["ct2", "hook"]


RAISE_IN = """
import errno, os
import {module} as m
def failing(*args, **kwargs):
    raise {error}
m.{function} = failing
"""


def scored(tmp_path) -> list:
    """bleu's arguments for two small files of its own."""
    for name in ("hyp.de", "ref.de"):
        (tmp_path / name).write_text("Ein Hund läuft.\n", encoding="utf-8")
    return [f"bleu.hyp={tmp_path}/hyp.de", f"bleu.ref={tmp_path}/ref.de", f"run_dir={tmp_path}/run"]


@pytest.mark.parametrize("code, cause", [(errno.ENOSPC, "No space left on device"), (errno.EMFILE, "Too many open files"),
                                         (errno.EROFS, "Read-only file system"), (errno.EACCES, "Permission denied")])
def test_any_error_of_the_operating_system_is_its_path_and_cause(tmp_path, code, cause):
    error = f"OSError({code}, os.strerror({code}), '/some/where/test.de')"
    hook = RAISE_IN.format(module="translate.verbs.bleu", function="score_files", error=error)
    result = run_cli("bleu", *scored(tmp_path), env=hook_env(tmp_path, hook))
    one_line_error(result, f"translate bleu: error: /some/where/test.de: {cause}")


def test_an_unexpected_error_is_one_line_and_its_traceback_on_request(tmp_path):
    hook = RAISE_IN.format(module="translate.verbs.bleu", function="score_files", error="RuntimeError('boom')")
    result = run_cli("bleu", *scored(tmp_path), env=hook_env(tmp_path, hook))
    one_line_error(result, "RuntimeError: boom", "HYDRA_FULL_ERROR=1 shows its traceback")
    full = run_cli("bleu", *scored(tmp_path), env=hook_env(tmp_path, hook, HYDRA_FULL_ERROR="1"))
    assert full.returncode != 0 and "Traceback" in full.stderr and "RuntimeError: boom" in full.stderr


def test_an_error_reads_as_its_first_line_or_else_its_type():
    assert headline(RuntimeError("boom\nits details")) == "RuntimeError: boom"
    assert headline(RuntimeError()) == "RuntimeError"
    assert first_line(ValueError("\n  the first line\nthe second")) == "the first line"
    assert first_line(ValueError("  ")) == "ValueError"


# --- the token cache ---------------------------------------------------------------------------


def prepared(tmp_path) -> Path:
    """A freshly prepared cache folder of the small model's data."""
    need(MULTI30K)
    cache = tmp_path / "cache"
    assert run_cli("prepare", *DATA, f"data.cache_dir={cache}", f"run_dir={tmp_path}/run").returncode == 0
    (folder,) = [p.parent for p in cache.glob("*/report.json")]
    return folder


def cut_one_token(folder: Path) -> None:
    """Two bytes off the end: a whole uint16 token, so the file still maps as tokens."""
    tokens = folder / "train.src_tokens.bin"
    os.truncate(tokens, tokens.stat().st_size - 2)


def flip_one_byte(folder: Path) -> None:
    """One byte changed, the size kept."""
    tokens = folder / "train.tgt_tokens.bin"
    data = bytearray(tokens.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tokens.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, named", [(cut_one_token, "train.src_tokens.bin has"),
                                           (flip_one_byte, "train.tgt_tokens.bin does not match its checksum")])
def test_a_damaged_cache_is_never_loaded(tmp_path, damage, named):
    from translate.core.errors import DamagedCache
    from translate.data.cache import load

    folder = prepared(tmp_path)
    damage(folder)
    with pytest.raises(DamagedCache, match=f"token cache {folder} is damaged: {named}"):
        load(folder)


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes: a damaged cache is never loaded: the test above
def test_train_rebuilds_a_damaged_cache_after_a_warning_naming_it(tmp_path):
    from translate.data.cache import load

    folder = prepared(tmp_path)
    cut_one_token(folder)
    run = tmp_path / "run"
    result = run_cli("train", *SMALL, f"data.cache_dir={folder.parent}", f"run_dir={run}", "train.max_steps=2")
    assert result.returncode == 0, result.stderr
    assert f"token cache {folder} is damaged: train.src_tokens.bin has" in result.stderr and "rebuilding it" in result.stderr
    assert len(load(folder).train) == 1014  # whole again, and verified
    again = run_cli("prepare", *DATA, f"data.cache_dir={folder.parent}", f"run_dir={run}")
    assert again.returncode == 0 and "using cached corpus" in again.stderr
    assert "damaged" not in again.stderr.replace(str(tmp_path), "")  # (this test's own folder is named for it)


# --- checkpoints ---------------------------------------------------------------------------------


def damaged_vocabulary(payload):
    payload["vocabulary"] = payload["vocabulary"][: len(payload["vocabulary"]) // 3]


def empty_vocabulary(payload):
    payload["vocabulary"] = b""


def wrong_shape(payload):
    payload["model"]["embedding.weight"] = payload["model"]["embedding.weight"][:5]


def missing_weight(payload):
    del payload["model"]["decoder_layers.0.src_attn.kv_proj.weight"]


def extra_weight(payload):
    payload["model"]["adapter.weight"] = torch.zeros(3)


def bad_settings(payload):
    payload["model_config"]["heads"] = 5  # d_model 32 is not divisible by 5


@pytest.mark.parametrize("damage, part", [
    # make test-slow, to keep the default suite under 10 minutes: four of the six (the checks are one function's)
    pytest.param(damaged_vocabulary, "its vocabulary (the sentencepiece model) cannot be read", marks=pytest.mark.slow),
    (empty_vocabulary, "its vocabulary (the sentencepiece model) is empty"),
    pytest.param(wrong_shape, "weight embedding.weight is (5, 32), but its model settings need (608, 32)", marks=pytest.mark.slow),
    (missing_weight, "lacks the weight decoder_layers.0.src_attn.kv_proj.weight"),
    pytest.param(extra_weight, "holds a weight its model settings do not have: adapter.weight", marks=pytest.mark.slow),
    pytest.param(bad_settings, "its model settings (model_config) are not valid: d_model (32) must be divisible by heads (5)",
                 marks=pytest.mark.slow),
])
def test_a_damaged_part_of_a_checkpoint_is_named_and_nothing_changes(tmp_path, trained_run, damage, part):
    payload = torch.load(run_dir_of(trained_run) / "checkpoint_last.pt", weights_only=True)
    damage(payload)
    path = tmp_path / "damaged.pt"
    torch.save(payload, path)
    before = path.read_bytes()
    for verb in ("decode", "export"):
        result = run_cli(verb, *trained_run, f"decode.checkpoint={path}", f"export.checkpoint={path}",
                         f"decode.output={tmp_path}/out.de", f"export.output={tmp_path}/export")
        one_line_error(result, str(path), part)
        assert "could run code" not in result.stderr  # that message is for pickles of code alone
    assert path.read_bytes() == before and not (tmp_path / "out.de").exists() and not (tmp_path / "export").exists()


def test_a_damaged_optimizer_state_stops_the_resume_naming_it(tmp_path, trained_run):
    run = tmp_path / "run"
    run.mkdir()
    payload = torch.load(run_dir_of(trained_run) / "checkpoint_last.pt", weights_only=True)
    payload["optimizer"]["param_groups"] = []  # a state for no parameters at all
    torch.save(payload, run / "checkpoint_last.pt")
    before = (run / "checkpoint_last.pt").read_bytes()
    overrides = [o for o in trained_run if not o.startswith("run_dir=")] + [f"run_dir={run}", "train.max_steps=40"]
    result = run_cli("train", *overrides)
    one_line_error(result, f"{run}/checkpoint_last.pt: its optimizer state cannot be restored", "move it away", logs=True)
    assert (run / "checkpoint_last.pt").read_bytes() == before


def test_written_files_get_the_umask_mode_or_keep_their_own(tmp_path):
    """atomic_write's temporary file is mkstemp's 0600: the file it becomes must not be."""
    from translate.core.paths import atomic_write

    old = os.umask(0o022)
    try:
        fresh, kept = tmp_path / "fresh.txt", tmp_path / "kept.txt"
        kept.write_text("before\n")
        kept.chmod(0o640)
        for path in (fresh, kept):
            with atomic_write(path) as file:
                file.write("after\n")
        assert (fresh.stat().st_mode & 0o777, kept.stat().st_mode & 0o777) == (0o644, 0o640)
        assert kept.read_text() == "after\n"
    finally:
        os.umask(old)


def test_a_folder_is_swapped_in_whole_or_not_at_all(tmp_path):
    """atomic_folder: a new folder gets the umask's mode (not mkdtemp's 0700), replaces a previous
    one whole, and a failure part-way leaves the previous one and nothing beside it."""
    from translate.core.errors import TranslateError
    from translate.core.paths import atomic_folder

    folder = tmp_path / "export"
    old = os.umask(0o022)
    try:
        with atomic_folder(folder, "the export") as staging:
            (staging / "model.bin").write_text("first\n")
        assert folder.stat().st_mode & 0o777 == 0o755 and (folder / "model.bin").read_text() == "first\n"
        with atomic_folder(folder, "the export") as staging:
            (staging / "weights.bin").write_text("second\n")
        assert sorted(p.name for p in folder.iterdir()) == ["weights.bin"]
        with pytest.raises(TranslateError, match=r"cannot write the export .*export: .*No space left on device; "
                                                 r"the previous one is intact"):
            with atomic_folder(folder, "the export") as staging:
                (staging / "half.bin").write_text("half\n")
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        with pytest.raises(ValueError):  # not an operating-system error: raised as it is
            with atomic_folder(folder, "the export"):
                raise ValueError("a bug")
        assert sorted(p.name for p in folder.iterdir()) == ["weights.bin"] and os.listdir(tmp_path) == ["export"]
    finally:
        os.umask(old)
