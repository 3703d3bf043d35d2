"""Hydra's submitit launcher (hydra_plugins/translate_launcher): DistributedDataParallel jobs
whose ranks come from submitit (SLURM's variables), with translate's presets."""

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FEW, RESUMABLE, ROOT, SMALL, cli, descendants, one_line_error, run, run_cli, start, wait_for


def test_submitit_local_runs_two_ranks_with_one_checkpoint(tmp_path, cache):
    """hydra/launcher=submitit_local with two tasks: ranks from submitit's JobEnvironment (no
    torchrun), a gloo process group, one checkpoint, Hydra's files from rank 0."""
    run_dir = tmp_path / "run"
    result = run_cli("train", "-m", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2", *FEW,
                     f"run_dir={run_dir}", f"data.cache_dir={cache}", timeout=300)
    logs = {p.name: p.read_text() for p in run_dir.glob("hydra/submitit/*/*_log.*")}
    assert result.returncode == 0, (result.stderr[-3000:], logs)
    assert sorted(p.name for p in run_dir.glob("*.pt")) == ["checkpoint_2.pt", "checkpoint_last.pt"]
    rank0 = next(text for name, text in logs.items() if name.endswith("_0_log.err"))
    rank1 = next(text for name, text in logs.items() if name.endswith("_1_log.err"))
    assert "x 1 accumulation x 2 processes" in rank0 and "stopped at update 2" in rank0
    assert "[translate.training.trainer][INFO]" not in rank1  # the other rank logs warnings only
    assert (run_dir / "hydra" / "train" / ".hydra" / "config.yaml").is_file()


@pytest.mark.slow  # make test-slow: about 30 s of two submitit jobs, kept out to hold the default suite under 10 minutes
def test_submitit_requeues_a_preempted_job_which_resumes_exactly(tmp_path, cache):
    """submitit's signal (preemption, or its warning before the time limit: SIGUSR2) to both
    tasks of a submitit_local job: they save at the next update, then rank 0 hands the signal to
    submitit's own handler, which requeues the job through submitit's checkpoint protocol (the
    local executor starts the tasks again, as SLURM would after `scontrol requeue`); the job
    resumes and ends as an uninterrupted one, tensor for tensor."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from compare_trees import differences

    def job(folder: str) -> list:
        overrides = [*SMALL[:-2], *RESUMABLE, "train.max_steps=20", f"run_dir={tmp_path / folder}", f"data.cache_dir={cache}"]
        return cli("train", "-m", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2", *overrides)

    agent = start(job("preempted"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(tmp_path / "preempted" / "checkpoint_5.pt", timeout=120)
        tasks = [pid for pid in descendants(agent.pid) if b"SUBMITIT_LOCAL_GLOBALID" in Path(f"/proc/{pid}/environ").read_bytes()]
        assert len(tasks) == 2
        for pid in tasks:
            os.kill(pid, signal.SIGUSR2)
        assert agent.wait(timeout=180) == 0
    finally:
        agent.kill()
    rank0 = next((tmp_path / "preempted").glob("hydra/submitit/*/*_0_log.err")).read_text()
    assert "stopped by SIGUSR2 (submitit's preemption or time-limit signal) and saved" in rank0
    assert "Calling checkpoint method." in rank0 and "Requeued job" in rank0
    assert "resuming from" in rank0 and "Job completed successfully" in rank0
    assert run(job("uninterrupted"), timeout=300).returncode == 0
    assert differences(tmp_path / "preempted" / "checkpoint_last.pt", tmp_path / "uninterrupted" / "checkpoint_last.pt") == []


def test_only_rank_0_of_a_submitit_job_writes_hydra_files():
    from hydra_plugins.translate_launcher.translate_launcher import task_overrides

    assert task_overrides(["optim.lr_scale=2"], 0) == ["optim.lr_scale=2"]
    quiet = task_overrides(["optim.lr_scale=2"], 3)
    assert quiet[0] == "optim.lr_scale=2" and "hydra.output_subdir=null" in quiet
    assert f"hydra.job_logging.handlers.file.filename={os.devnull}" in quiet


def test_submitit_slurm_preset_asks_for_one_task_per_gpu(tmp_path, monkeypatch):
    """hydra/launcher=submitit_slurm with nodes and gpus_per_node: the sbatch script submitit
    would submit (no SLURM here: the submission is caught before sbatch)."""
    import submitit
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.plugins import Plugins
    from hydra.core.utils import setup_globals
    from hydra.types import HydraContext

    from translate.hydra_cli import CONFIG_DIR, config_name, quiet_hydra_warnings, register

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexit 1\n")  # submitit's SLURM executor looks for it
    (fake / "srun").chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    submitted = {}

    def caught(self, function, *arguments):
        submitted["launcher"] = function
        submitted["sbatch"] = self._executor._make_submission_file_text("COMMAND", "0")
        return []

    monkeypatch.setattr(submitit.AutoExecutor, "map_array", caught)
    register()
    quiet_hydra_warnings()
    setup_globals()
    GlobalHydra.instance().clear()
    overrides = ["config=tiny", f"run_dir={tmp_path}/run", "hydra/launcher=submitit_slurm", "hydra.launcher.nodes=2",
                 "hydra.launcher.gpus_per_node=4", "hydra.launcher.partition=gpu"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name("train"), overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        launcher = Plugins.instance().instantiate_launcher(
            hydra_context=HydraContext(config_loader=None, callbacks=None), task_function=lambda _: None, config=cfg)
        launcher.launch([["optim.lr_scale=1"]], initial_job_idx=0)
        with pytest.raises(Exception, match="gpus_per_nod"):  # the plugin's schema: typos fail
            compose(config_name("train"), overrides=overrides + ["hydra.launcher.gpus_per_nod=4"], return_hydra_config=True)
    GlobalHydra.instance().clear()
    sbatch = submitted["sbatch"]
    assert type(submitted["launcher"]).__name__ == "TranslateSlurmLauncher"
    for line in ("--nodes=2", "--gpus-per-node=4", "--ntasks-per-node=4", "--partition=gpu", "--signal=USR2@120",
                 "--time=1440", "--job-name=translate-tiny", f"--output={tmp_path}/run/hydra/submitit/%j/"):
        assert f"#SBATCH {line}" in sbatch, (line, sbatch)
    # One failing task ends the job instead of leaving the others in a collective.
    assert "export SLURM_KILL_BAD_EXIT=1" in sbatch.split("srun")[0]


def test_submitit_time_limit_warning_is_a_stop_signal(monkeypatch):
    """In a submitit task, submitit's signal before SLURM's time limit saves like SIGTERM does."""
    import signal as signals

    from translate.training.stop_signals import stop_signal_numbers

    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    assert stop_signal_numbers() == [signals.SIGTERM, signals.SIGUSR1, signals.SIGINT]
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
    assert stop_signal_numbers() == [signals.SIGTERM, signals.SIGUSR1, signals.SIGINT, signals.SIGUSR2]


def test_a_launcher_without_multirun_is_one_clear_error():
    result = run_cli("train", "hydra/launcher=submitit_slurm", "config=tiny")
    one_line_error(result, "takes effect in a multirun only", "translate train -m hydra/launcher=submitit_slurm")


def test_the_stop_line_says_submitit_requeues_where_its_signal_stopped_the_run(monkeypatch):
    import signal

    from translate.training.stop_signals import StopSignals

    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    stops = StopSignals()
    try:
        stops.received = signal.SIGUSR2  # submitit's preemption and time-limit signal
        assert stops.how_to_resume() == "submitit requeues the job, which resumes from it"
        stops.received = signal.SIGTERM
        assert stops.how_to_resume() == "run the same command to resume"
    finally:
        stops.received = None  # close() would hand a received SIGUSR2 on to submitit's handler
        stops.close()
