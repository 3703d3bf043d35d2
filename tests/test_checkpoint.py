"""Numbered checkpoints, keep_last, averaging (paper, section 6.1) and its use by decode."""

from pathlib import Path

import pytest
import torch

from tests.conftest import MULTI30K, need, one_line_error, run_cli, small_run
from translate import averaging, checkpoint
from translate.checkpoint import Checkpoint
from translate.core import paths
from translate.core.config import ModelConfig, to_plain
from translate.core.errors import TranslateError
from translate.data.vocabulary import SpecialIds
from translate.model import Transformer


def write_model(path: Path, seed: int, d_model: int = 16, step: int = 1) -> dict:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=d_model, d_ff=32, heads=2, layers=1, vocab_size=30)
    payload = {"model": Transformer(cfg).state_dict(), "model_config": to_plain(cfg), "vocabulary": b"spm", "step": step}
    checkpoint.save(path, payload)
    return payload


def test_average_is_the_elementwise_mean(tmp_path):
    payloads = [write_model(tmp_path / f"checkpoint_{i}.pt", seed=i, step=i) for i in (1, 2, 3)]
    averaged = averaging.average([tmp_path / f"checkpoint_{i}.pt" for i in (1, 2, 3)])
    for name, tensor in averaged.model.items():
        expected = (payloads[0]["model"][name] + payloads[1]["model"][name] + payloads[2]["model"][name]) / 3
        torch.testing.assert_close(tensor, expected, rtol=1e-6, atol=1e-7)
    assert averaged.step == 3 and len(averaged.averaged) == 3


def test_a_checkpoint_saves_the_dict_it_loads(tmp_path):
    """Checkpoint names the fields of the dict torch.save writes: read and saved again, every
    kind (numbered, checkpoint_last.pt, checkpoint_best.pt, an average, one from before specials,
    languages and lowercase were recorded) is the same dict, its keys in the same order."""
    weights = write_model(tmp_path / "plain.pt", seed=1)  # model, model_config, vocabulary, step only
    full = {**weights, "specials": {"pad": 0, "unk": 1, "bos": 2, "eos": 3}, "languages": ["en", "de"], "lowercase": False}
    full = {key: full[key] for key in ("model", "model_config", "vocabulary", "specials", "languages", "step", "lowercase")}
    last = {**full, "optimizer": {"state": {}}, "scheduler": {"applied": 3}, "config": {"optim": {}}, "processes": [{}],
            "valid": {"best": None}, "skipped_updates": 0, "scaler": {"scale": 2.0}}
    average = {**{k: v for k, v in full.items() if k not in ("model", "step")}, "model": full["model"], "step": 3,
               "averaged": ["a/checkpoint_2.pt", "a/checkpoint_3.pt"]}
    for name, payload in (("numbered", full), ("last", last), ("best", {**full, "dev": {"bleu": 1.0}}), ("average", average)):
        checkpoint.save(tmp_path / f"{name}.pt", payload)
        Checkpoint.load(tmp_path / f"{name}.pt").save(tmp_path / f"{name}.again.pt")
        again = checkpoint.load(tmp_path / f"{name}.again.pt")
        assert list(again) == list(payload), name
        assert all(again[k] == payload[k] for k in payload if k != "model"), name
    old = Checkpoint.load(tmp_path / "plain.pt")
    assert (old.special_ids(), old.languages, old.lowercase, old.averaged) == (SpecialIds(), None, False, None)
    assert Checkpoint.load(tmp_path / "average.again.pt").identity().averaged == ("checkpoint_2.pt", "checkpoint_3.pt")


def test_averaging_different_models_fails_clearly(tmp_path):
    write_model(tmp_path / "checkpoint_1.pt", seed=1)
    write_model(tmp_path / "checkpoint_2.pt", seed=2, d_model=32)
    with pytest.raises(TranslateError, match=r"checkpoint_2.pt holds a different model \(d_model .*\): it cannot be averaged"):
        averaging.average([tmp_path / "checkpoint_1.pt", tmp_path / "checkpoint_2.pt"])


def test_numbered_order_and_prune(tmp_path):
    for step in (10, 2, 100, 30):
        write_model(tmp_path / f"checkpoint_{step}.pt", seed=step, step=step)
    (tmp_path / "checkpoint_last.pt").write_bytes(b"")
    assert [p.name for p in paths.numbered_checkpoints(tmp_path)] == [f"checkpoint_{s}.pt" for s in (2, 10, 30, 100)]
    assert [paths.numbered_update(tmp_path / name) for name in ("checkpoint_30.pt", "checkpoint_last.pt", "checkpoint_3a.pt")] == [30, None, None]
    checkpoint.prune(tmp_path, keep_last=2)
    assert [p.name for p in paths.numbered_checkpoints(tmp_path)] == ["checkpoint_30.pt", "checkpoint_100.pt"]
    assert (tmp_path / "checkpoint_last.pt").exists()


def test_train_keeps_the_last_numbered_checkpoints_and_decode_averages_them(tmp_path):
    need(MULTI30K)
    run_dir = tmp_path / "run"
    overrides = small_run(tmp_path, "train.max_steps=8", "checkpoint.every_steps=2", "checkpoint.keep_last=3")
    result = run_cli("train", *overrides)
    assert result.returncode == 0, result.stderr
    assert [p.name for p in paths.numbered_checkpoints(run_dir)] == ["checkpoint_4.pt", "checkpoint_6.pt", "checkpoint_8.pt"]
    assert "optimizer" in checkpoint.load(run_dir / "checkpoint_last.pt")
    assert "optimizer" not in checkpoint.load(run_dir / "checkpoint_8.pt")  # weights only

    decoded = run_cli("decode", *overrides, "checkpoint.average_last=3", "decode.max_len_b=3")
    assert decoded.returncode == 0, decoded.stderr
    averaged = checkpoint.load(run_dir / "checkpoint_average.pt")
    assert [Path(p).name for p in averaged["averaged"]] == ["checkpoint_4.pt", "checkpoint_6.pt", "checkpoint_8.pt"]

    result = run_cli("average", *overrides, "checkpoint.average_last=2")
    assert result.returncode == 0, result.stderr
    assert len(checkpoint.load(run_dir / "checkpoint_average.pt")["averaged"]) == 2
    one_line_error(run_cli("average", *overrides, "checkpoint.average_last=0"), "checkpoint.average_last")


def test_time_based_checkpoints(tmp_path):
    need(MULTI30K)
    result = run_cli("train", *small_run(tmp_path, "train.max_steps=3", "checkpoint.every_steps=1000",
                                         "checkpoint.every_minutes=0.00001"))
    assert result.returncode == 0, result.stderr
    assert [p.name for p in paths.numbered_checkpoints(tmp_path / "run")] == ["checkpoint_1.pt", "checkpoint_2.pt", "checkpoint_3.pt"]


class Planted:
    """Unpickled by a plain pickle loader, this creates a file: what a shared .pt could do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def planted_checkpoint(path: Path, marker: Path) -> Path:
    payload = write_model(path, seed=0)
    payload["model"]["embedding.weight"] = Planted(marker)
    torch.save(payload, path)
    return path


def test_a_pickle_that_would_run_code_is_refused_on_every_load_path(tmp_path, compose):
    """Resume, init_from, decode, average and export: one line naming the file, and nothing
    in it runs (the file it would create never appears)."""
    from translate.data.vocabulary import Vocabulary
    from translate.training.resume import load_training_state, load_weights
    from translate.translator import Translator
    from translate.verbs.export import export

    marker = tmp_path / "ran"
    evil = planted_checkpoint(tmp_path / "run" / "checkpoint_1.pt", marker)
    cfg = ModelConfig(d_model=16, d_ff=32, heads=2, layers=1, vocab_size=30)
    model = Transformer(cfg)
    attempts = {
        "resume": lambda: load_training_state(evil, model, cfg, Vocabulary.__new__(Vocabulary), optim=None,
                                               optimizer=None, schedule=None, scaler=None),
        "init_from": lambda: load_weights(evil, model, cfg, None),
        "decode": lambda: Translator.from_checkpoint(evil),
        "average": lambda: averaging.average_last(evil.parent, 1),
        "export": lambda: export(compose("export", f"export.checkpoint={evil}", f"export.output={tmp_path}/out")),
    }
    for name, attempt in attempts.items():
        with pytest.raises(TranslateError, match="is not a plain checkpoint: it holds an object of io.open") as error:
            attempt()
        assert str(evil) in str(error.value) and "\n" not in str(error.value), name
    assert not marker.exists()
    one_line_error(run_cli("decode", f"decode.checkpoint={evil}", f"run_dir={tmp_path}/run"), "not a plain checkpoint")
    assert not marker.exists()


def test_checkpoints_of_before_load_safely(tmp_path):
    """torch.save of the same plain data, as every earlier version wrote: tensors, numbers,
    strings, bytes, lists, tuples and dicts load without the weights-only loader objecting."""
    payload = write_model(tmp_path / "old.pt", seed=1)
    payload.update(optimizer={"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"betas": (0.9, 0.98)}]},
                   scheduler={"last_epoch": 3, "base_lrs": [1.0], "_last_lr": [0.5], "lr_lambdas": [None]},
                   processes=[{"torch": torch.get_rng_state(), "batches": {"epoch": 0, "position": 3}}])
    torch.save(payload, tmp_path / "old.pt")
    loaded = checkpoint.load(tmp_path / "old.pt")
    assert loaded["scheduler"]["last_epoch"] == 3 and loaded["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.98)


def test_a_damaged_checkpoint_is_one_line_and_nothing_changes(tmp_path):
    write_model(tmp_path / "checkpoint_1.pt", seed=1)
    whole = (tmp_path / "checkpoint_1.pt").read_bytes()
    (tmp_path / "checkpoint_1.pt").write_bytes(whole[: len(whole) // 2])
    before = sorted((p.name, p.read_bytes()) for p in tmp_path.iterdir())
    with pytest.raises(TranslateError, match="checkpoint_1.pt cannot be read, it is damaged or truncated") as error:
        averaging.average_last(tmp_path, 1)
    assert "move it away, or use another checkpoint" in str(error.value) and "\n" not in str(error.value)
    assert sorted((p.name, p.read_bytes()) for p in tmp_path.iterdir()) == before


def test_averaging_while_training_deletes_the_oldest(tmp_path, monkeypatch):
    """decode builds the average while training saves a newer checkpoint and prunes the oldest
    (checkpoint.keep_last): the newest ones are listed again and averaged."""
    for step in (1, 2, 3):
        write_model(tmp_path / f"checkpoint_{step}.pt", seed=step, step=step)
    original = checkpoint.load

    def training_meanwhile(path):
        if path.name == "checkpoint_1.pt" and path.exists():  # between listing and reading it
            write_model(tmp_path / "checkpoint_4.pt", seed=4, step=4)
            path.unlink()
        return original(path)

    monkeypatch.setattr(checkpoint, "load", training_meanwhile)
    destination = averaging.average_last(tmp_path, 3)
    averaged = original(destination)
    assert [Path(p).name for p in averaged["averaged"]] == ["checkpoint_2.pt", "checkpoint_3.pt", "checkpoint_4.pt"]


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes: the atomic write: test_resume's kill during a write
def test_a_full_disk_while_saving_loses_nothing(tmp_path):
    """A real write error (a file-size limit: EFBIG) while checkpoint_last.pt is written: one
    line naming it, the previous one intact and loadable, no temporary file left, exit 1."""
    import resource
    import signal

    need(MULTI30K)
    overrides = small_run(tmp_path, "checkpoint.every_steps=5", "checkpoint.every_minutes=null", "valid.every_steps=0")
    assert run_cli("train", *overrides, "train.max_steps=5").returncode == 0
    last = tmp_path / "run" / "checkpoint_last.pt"
    assert last.stat().st_size > 200_000  # the limit below stops it, and nothing smaller

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    result = run_cli("train", *overrides, "train.max_steps=10", preexec_fn=limited)
    assert result.returncode == 1, result.stderr
    line = next(l for l in result.stderr.splitlines() if "error:" in l)
    assert f"cannot write {last}: File too large; the previous checkpoint_last.pt is intact" in line
    assert checkpoint.load(last)["step"] == 5
    assert not list((tmp_path / "run").glob(".checkpoint*"))  # no half-written file left behind


def test_a_checkpoint_the_disk_cannot_read_is_not_called_damaged(tmp_path, monkeypatch):
    """An error of the operating system while reading (here EIO) names its cause: the file may
    be whole, so the line does not call it damaged."""
    import errno
    import os

    path = tmp_path / "checkpoint_1.pt"
    write_model(path, seed=1)

    def unreadable(*args, **kwargs):
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))

    monkeypatch.setattr(torch, "load", unreadable)
    with pytest.raises(TranslateError, match="cannot read the checkpoint") as error:
        checkpoint.load(path)
    assert "Input/output error" in str(error.value) and "damaged" not in str(error.value)
