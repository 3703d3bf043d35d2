"""Checkpoints written in the background (checkpoint.background): the same bytes as a save that
stops training, the values of the moment of the save whatever training does next, failures
raised on the main thread, and a training run whose files equal a foreground run's."""

import threading

import pytest
import torch

from tests.conftest import MULTI30K, need, run_cli, small_run
from translate import checkpoint
from translate.core.errors import TranslateError
from translate.training.checkpoint_writer import CheckpointWriter


def payloads():
    """checkpoint_last's and a numbered one's, as Trainer.save builds them: the weights shared
    by both, an embedding tied to the output projection, a view, Adam's moments."""
    torch.manual_seed(0)
    embedding = torch.randn(12, 4)
    weights = {"embedding.weight": embedding.detach(), "output.weight": embedding.detach(),
               "layer.weight": torch.randn(4, 4), "layer.bias": torch.randn(8)[2:6]}
    moments = {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(12, 4), "exp_avg_sq": torch.rand(12, 4)}}
    base = {"model": weights, "model_config": {"d_model": 4}, "vocabulary": b"spm", "step": 3}
    return [{**base, "optimizer": {"state": moments, "param_groups": [{"lr": 0.1}]}}, base]


def test_a_background_write_is_byte_for_byte_a_foreground_one(tmp_path):
    last, numbered = payloads()
    CheckpointWriter(background=False).save([(tmp_path / "fg_last.pt", last), (tmp_path / "fg_3.pt", numbered)])
    writer = CheckpointWriter(background=True)
    writer.save([(tmp_path / "bg_last.pt", last), (tmp_path / "bg_3.pt", numbered)])
    writer.wait()
    assert (tmp_path / "bg_last.pt").read_bytes() == (tmp_path / "fg_last.pt").read_bytes()
    assert (tmp_path / "bg_3.pt").read_bytes() == (tmp_path / "fg_3.pt").read_bytes()
    loaded = checkpoint.load(tmp_path / "bg_last.pt")["model"]
    assert loaded["embedding.weight"].untyped_storage().data_ptr() == loaded["output.weight"].untyped_storage().data_ptr()


def test_the_file_holds_the_weights_of_the_moment_of_the_save(tmp_path, monkeypatch):
    """Training changes its weights in place while the thread writes: the file must not see it.
    The write is held until the weights have changed, so that without the copy it would."""
    release, real_save = threading.Event(), checkpoint.save

    def held(path, payload):
        assert release.wait(30)
        real_save(path, payload)

    monkeypatch.setattr(checkpoint, "save", held)
    last, numbered = payloads()
    expected = last["model"]["layer.weight"].clone()
    writer = CheckpointWriter(background=True)
    writer.save([(tmp_path / "last.pt", last)])
    last["model"]["layer.weight"].add_(1.0)  # the next update
    last["optimizer"]["state"][0]["exp_avg"].zero_()
    release.set()
    writer.wait()
    saved = checkpoint.load(tmp_path / "last.pt")
    torch.testing.assert_close(saved["model"]["layer.weight"], expected, rtol=0, atol=0)
    assert saved["optimizer"]["state"][0]["exp_avg"].abs().sum() > 0


def test_the_order_of_the_steps_and_a_failed_write_raised_on_the_main_thread(tmp_path):
    calls, main = [], threading.current_thread()
    writer = CheckpointWriter(background=True)
    last, _ = payloads()
    writer.save([(tmp_path / "last.pt", last)], after_files=lambda: calls.append(("files", (tmp_path / "last.pt").is_file())),
                after=lambda: calls.append(("after", threading.current_thread() is main)))
    writer.wait()
    assert calls == [("files", True), ("after", True)]

    (tmp_path / "not_a_folder").write_text("a file where the run's folder should be")
    writer.save([(tmp_path / "not_a_folder" / "last.pt", last)], after=lambda: calls.append("never"))
    with pytest.raises(TranslateError, match="not_a_folder"):
        writer.wait()
    assert calls == [("files", True), ("after", True)]  # a failed write has no `after`
    writer.wait()  # raised once, then nothing is pending


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes on an AVX2 Zen 1: the write itself: the tests above
def test_a_training_run_writes_the_same_checkpoints_either_way(tmp_path):
    """The same run with the background write and without: every checkpoint the same (the
    config names its own run_dir, so compared as data), the run record at the last one."""
    need(MULTI30K)
    runs = {}
    for name, value in (("plain", "false"), ("other", "true")):
        overrides = small_run(tmp_path, "train.max_steps=6", "checkpoint.every_steps=2", "checkpoint.keep_last=2",
                              "checkpoint.every_minutes=null", "valid.every_steps=3", f"checkpoint.background={value}",
                              folder=name)
        result = run_cli("train", *overrides)
        assert result.returncode == 0, result.stderr
        runs[name] = tmp_path / name
    names = sorted(p.name for p in runs["plain"].glob("checkpoint_*.pt"))
    assert names == ["checkpoint_4.pt", "checkpoint_6.pt", "checkpoint_best.pt", "checkpoint_last.pt"]
    assert sorted(p.name for p in runs["other"].glob("checkpoint_*.pt")) == names
    assert not list(runs["other"].glob(".checkpoint*"))  # no temporary file left
    for name in names:
        a, b = (checkpoint.load(runs[run] / name) for run in ("plain", "other"))
        a.pop("config", None), b.pop("config", None)
        assert_same(a, b, name)
    from translate.core.run_record import RunRecord

    assert RunRecord.load(runs["other"]).training.updates == 6


def assert_same(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}/{i}")
    else:
        assert a == b, where
