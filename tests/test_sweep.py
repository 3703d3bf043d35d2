"""Multirun sweeps: a run_dir per job, nothing left behind between jobs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import FEW, hook_env, run, torchrun


# Records, around every training job of a sweep, what a job could leave behind in its process.
PROBE = """
import os
if "TRANSLATE_PROBE" in os.environ:
    import json, logging, signal, threading, time
    import torch, torch.distributed as dist
    import translate.verbs.train as t

    def state():
        threads = sorted(t.name for t in threading.enumerate() if t.name != "tqdm_monitor")  # tqdm's, for good
        return {"dist": dist.is_initialized(), "python_threads": threads,
                "torch_threads": torch.get_num_threads(), "log_level": logging.getLogger("translate").level,
                **{name: repr(signal.getsignal(getattr(signal, name))) for name in ("SIGTERM", "SIGUSR1", "SIGUSR2")}}

    original = t.train

    def probed(cfg):
        before = state()
        if os.environ.get("RANK") == "1":  # the other rank joins each process group late
            time.sleep(1)
        try:
            return original(cfg)
        finally:
            record = {"rank": os.environ.get("RANK"), "run_dir": cfg.run_dir, "before": before, "after": state()}
            with open(os.environ["TRANSLATE_PROBE"], "a") as f:
                f.write(json.dumps(record) + "\\n")

    t.train = probed
"""


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes on an AVX2 Zen 1: torchrun's ranks: test_distributed; a sweep's run_dirs: the tests above
def test_sweep_under_torchrun_gives_each_job_its_run_dir_and_leaves_nothing_behind(tmp_path, cache):
    """Two jobs, one after the other in the same two torchrun processes (the basic launcher):
    each job joins a new process group and tears it down, with its writer and signal handlers.
    (Without a fresh store prefix for the second group, it hangs: the timeout. Without the
    collectives holding their tensors, a job's end sometimes hung under load: distributed._held.)"""
    probe = tmp_path / "probe.jsonl"
    env = hook_env(tmp_path, PROBE, TRANSLATE_PROBE=str(probe))
    run_dir = tmp_path / "run"
    result = run(torchrun("train", "-m", *FEW, "optim.lr_scale=1,2", f"run_dir={run_dir}", f"data.cache_dir={cache}"),
                 env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]

    jobs = sorted(p.name for p in run_dir.iterdir() if p.is_dir())
    assert jobs == ["optim.lr_scale:1", "optim.lr_scale:2"]
    for job, scale in zip(jobs, (1.0, 2.0)):
        assert sorted(p.name for p in (run_dir / job).glob("*.pt")) == ["checkpoint_2.pt", "checkpoint_last.pt"]
        payload = torch.load(run_dir / job / "checkpoint_last.pt", map_location="cpu", weights_only=False)
        assert payload["config"]["optim"]["lr_scale"] == scale and payload["step"] == 2
        assert (run_dir / job / "hydra" / "train" / ".hydra" / "overrides.yaml").is_file()
    assert (run_dir / "multirun.yaml").is_file()
    assert (result.stdout + result.stderr).count("Launching 2 jobs") == 1  # Hydra's own log lines: rank 0 only

    records = [json.loads(line) for line in probe.read_text().splitlines()]
    assert sorted((r["rank"], Path(r["run_dir"]).name) for r in records) == [
        ("0", "optim.lr_scale:1"), ("0", "optim.lr_scale:2"), ("1", "optim.lr_scale:1"), ("1", "optim.lr_scale:2")]
    for rank in ("0", "1"):
        first, second = [r for r in records if r["rank"] == rank]
        assert not first["before"]["dist"]
        assert first["after"] == first["before"], first  # signal handlers, process group, writer thread, ...
        assert second["before"] == first["before"] and second["after"] == second["before"], second


def test_a_sweep_job_run_dir_is_a_plain_override(compose):
    """decode and bleu take a sweep job's folder as run_dir=..., unquoted."""
    from translate.hydra_cli import sweep_job_dir

    folder = sweep_job_dir("optim.lr_scale:2+train.seed:3")
    assert folder == "optim.lr_scale:2+train.seed:3"
    assert compose("decode", f"run_dir=runs/x/{folder}").run_dir == f"runs/x/{folder}"
    assert sweep_job_dir("") == "."
    assert sweep_job_dir("data.path:/a/b+optim.betas:[0.9,0.99]") == "data.path:_a_b+optim.betas:_0.9_0.99_"
    assert len(sweep_job_dir("x:" + "y" * 400)) < 200


def test_sweep_folders_name_only_the_swept_keys():
    from translate.hydra_cli import sweep_overrides

    assert sweep_overrides(["config=tiny", "optim.lr_scale=1,2"]) == []  # not a multirun
    (excluded,) = sweep_overrides(["-m", "config=tiny", "data.path=/x/y", "optim.lr_scale=1,2", "model=tiny,base",
                                    "hydra/launcher=submitit_local", "run_dir=runs/a"])
    assert excluded == "hydra.job.config.override_dirname.exclude_keys=['config','data.path','run_dir']"


def test_added_overrides_stay_beside_the_users():
    from translate.hydra_cli import with_overrides

    assert with_overrides(["-m", "a=1,2", "--cfg", "hydra"], ["x=1"]) == ["-m", "x=1", "a=1,2", "--cfg", "hydra"]
    assert with_overrides(["--cfg", "job"], ["x=1"]) == ["--cfg", "job", "x=1"]
    assert with_overrides(["a=1"], []) == ["a=1"]


@pytest.mark.parametrize("stderr", [subprocess.PIPE, subprocess.STDOUT])
def test_a_command_past_its_timeout_fails_with_where_each_of_its_threads_waited(stderr):
    """The harness behind the torchrun tests: a command that hangs fails its test with every
    thread's Python stack (faulthandler, on SIGABRT), so that a hang seen once can be read;
    also where the caller sent stderr into stdout."""
    script = ("import threading, time\n"
              "def waiter():\n    time.sleep(60)\n"
              "threading.Thread(target=waiter, daemon=True).start()\n"
              "time.sleep(60)\n")
    with pytest.raises(AssertionError, match="did not end within 2 s") as failure:
        run([sys.executable, "-c", script], timeout=2, stderr=stderr)
    stacks = str(failure.value)
    assert stacks.lower().count("thread 0x") == 2 and "in waiter" in stacks and "in <module>" in stacks, stacks
