"""Mixed precision (translate.training.precision): bf16 and fp16 training on the CPU."""

import numpy as np
import pytest
import torch

from tests.conftest import MULTI30K, need, run_cli, small_run


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_reduced_precision_runs_on_cpu(tmp_path, precision):
    need(MULTI30K)
    result = run_cli("train", *small_run(tmp_path, "train.max_steps=4", "train.log_every=2", f"train.precision={precision}"))
    assert result.returncode == 0, result.stderr
    assert f"{precision} on cpu" in result.stderr
    losses = [float(line.split("loss ")[1].split()[0]) for line in result.stderr.splitlines() if "] - update " in line]
    assert len(losses) == 2 and all(np.isfinite(losses))
    payload = torch.load(tmp_path / "run" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert all(torch.isfinite(t).all() for t in payload["model"].values())
    assert ("scaler" in payload) == (precision == "fp16")
