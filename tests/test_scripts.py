"""Every script in scripts/ documents itself with --help; torchrun launches the train verb."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT, SMALL, need, MULTI30K

SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_script_help(script):
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


def test_torchrun_single_process_trains(tmp_path):
    need(MULTI30K)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "--master_port=29533"]
    overrides = SMALL[:-2] + ["train.max_steps=2", f"run_dir={tmp_path}/run", f"data.cache_dir={tmp_path}/cache"]
    result = subprocess.run([*torchrun, "-m", "translate", "train", *overrides], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run" / "checkpoint_last.pt").is_file()
