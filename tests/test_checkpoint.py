"""Numbered checkpoints, keep_last, averaging (paper, section 6.1) and its use by decode."""

from pathlib import Path

import pytest
import torch

from tests.conftest import MULTI30K, SMALL, need, run_cli
from translate import checkpoint
from translate.config import ModelConfig
from translate.errors import TranslateError
from translate.model import Transformer


def write_model(path: Path, seed: int, d_model: int = 16, step: int = 1) -> dict:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=d_model, d_ff=32, heads=2, layers=1, vocab_size=30)
    payload = {"model": Transformer(cfg).state_dict(), "model_config": cfg.__dict__, "vocabulary": b"spm", "step": step}
    checkpoint.save(path, payload)
    return payload


def test_average_is_the_elementwise_mean(tmp_path):
    payloads = [write_model(tmp_path / f"checkpoint_{i}.pt", seed=i, step=i) for i in (1, 2, 3)]
    averaged = checkpoint.average([tmp_path / f"checkpoint_{i}.pt" for i in (1, 2, 3)])
    for name, tensor in averaged["model"].items():
        expected = (payloads[0]["model"][name] + payloads[1]["model"][name] + payloads[2]["model"][name]) / 3
        torch.testing.assert_close(tensor, expected, rtol=1e-6, atol=1e-7)
    assert averaged["step"] == 3 and len(averaged["averaged"]) == 3


def test_averaging_different_models_fails_clearly(tmp_path):
    write_model(tmp_path / "checkpoint_1.pt", seed=1)
    write_model(tmp_path / "checkpoint_2.pt", seed=2, d_model=32)
    with pytest.raises(TranslateError, match="another model or vocabulary"):
        checkpoint.average([tmp_path / "checkpoint_1.pt", tmp_path / "checkpoint_2.pt"])


def test_numbered_order_and_prune(tmp_path):
    for step in (10, 2, 100, 30):
        write_model(tmp_path / f"checkpoint_{step}.pt", seed=step, step=step)
    (tmp_path / "checkpoint_last.pt").write_bytes(b"")
    assert [p.name for p in checkpoint.numbered(tmp_path)] == [f"checkpoint_{s}.pt" for s in (2, 10, 30, 100)]
    checkpoint.prune(tmp_path, keep_last=2)
    assert [p.name for p in checkpoint.numbered(tmp_path)] == ["checkpoint_30.pt", "checkpoint_100.pt"]
    assert (tmp_path / "checkpoint_last.pt").exists()


def test_train_keeps_the_last_numbered_checkpoints_and_decode_averages_them(tmp_path):
    need(MULTI30K)
    run_dir = tmp_path / "run"
    overrides = SMALL[:-2] + ["train.max_steps=8", "checkpoint.every_steps=2", "checkpoint.keep_last=3",
                              f"run_dir={run_dir}", f"data.cache_dir={tmp_path}/cache"]
    result = run_cli("train", *overrides)
    assert result.returncode == 0, result.stderr
    assert [p.name for p in checkpoint.numbered(run_dir)] == ["checkpoint_4.pt", "checkpoint_6.pt", "checkpoint_8.pt"]
    assert "optimizer" in checkpoint.load(run_dir / "checkpoint_last.pt")
    assert "optimizer" not in checkpoint.load(run_dir / "checkpoint_8.pt")  # weights only

    decoded = run_cli("decode", *overrides, "checkpoint.average_last=3", "decode.max_len_b=3")
    assert decoded.returncode == 0, decoded.stderr
    averaged = checkpoint.load(run_dir / "checkpoint_average.pt")
    assert [Path(p).name for p in averaged["averaged"]] == ["checkpoint_4.pt", "checkpoint_6.pt", "checkpoint_8.pt"]

    result = run_cli("average", *overrides, "checkpoint.average_last=2")
    assert result.returncode == 0, result.stderr
    assert len(checkpoint.load(run_dir / "checkpoint_average.pt")["averaged"]) == 2
    refused = run_cli("average", *overrides, "checkpoint.average_last=0")
    assert refused.returncode == 1 and "checkpoint.average_last" in refused.stderr


def test_time_based_checkpoints(tmp_path):
    need(MULTI30K)
    run_dir = tmp_path / "run"
    overrides = SMALL[:-2] + ["train.max_steps=3", "checkpoint.every_steps=1000", "checkpoint.every_minutes=0.00001",
                              f"run_dir={run_dir}", f"data.cache_dir={tmp_path}/cache"]
    result = run_cli("train", *overrides)
    assert result.returncode == 0, result.stderr
    assert [p.name for p in checkpoint.numbered(run_dir)] == ["checkpoint_1.pt", "checkpoint_2.pt", "checkpoint_3.pt"]
