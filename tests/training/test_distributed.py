"""Distributed training on the CPU (gloo): the update does not depend on how it is split."""

import os
import re
import sys
import time
from dataclasses import replace

import pytest
import torch

from tests.conftest import (MULTI30K, SMALL, TORCHRUN, cli, free_port, gloo_pair, hook_env, in_update, need, run, small_run,
                            start, torchrun)

# Dropout off, and an Adam whose update is proportional to the gradient (eps >> |g|), scaled
# up so that the updates are substantial: Adam is blind to a constant error in the loss scale.
EXACT = ["model.dropout=0.0", "optim.eps=10.0", "optim.lr_scale=2000", "train.max_steps=3",
         "train.tokens_per_batch=800", "train.log_every=1"]


def weights(path):
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def test_two_processes_equal_one_process_with_accumulation(tmp_path):
    need(MULTI30K)
    common = SMALL + EXACT + [f"data.cache_dir={tmp_path}/cache", "train.tokens_per_update=1600"]
    one = run(cli("train", *common, f"run_dir={tmp_path}/one"))
    assert one.returncode == 0, one.stderr
    assert "x 2 accumulation x 1 processes" in one.stderr
    two = run(torchrun("train", *common, f"run_dir={tmp_path}/two"))
    assert two.returncode == 0, two.stderr
    assert "x 1 accumulation x 2 processes" in two.stderr
    a, b = weights(tmp_path / "one" / "checkpoint_last.pt"), weights(tmp_path / "two" / "checkpoint_last.pt")
    initial = None
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)
    # The updates were substantial: the weights moved well beyond the tolerance.
    from translate.model import Transformer
    from translate.checkpoint import Checkpoint

    torch.manual_seed(1)
    payload = torch.load(tmp_path / "one" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    initial = Transformer(Checkpoint.from_payload(payload).model_config()).state_dict()
    moved = max((a[n] - initial[n]).abs().max().item() for n in a)
    assert moved > 1e-2


def _gradient_worker(rank, port, overrides, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    from translate.training import distributed
    from translate.hydra_cli import load_config
    from translate.data.batching import collate, token_batches
    from translate.data.preparation import prepare
    from translate.model import Transformer
    from translate.training.loss import LabelSmoothedObjective
    from translate.training.update import train_step

    context = distributed.init()
    try:
        cfg = load_config("train", overrides)
        data = prepare(cfg.data, log=lambda _: None)
        torch.manual_seed(0)
        model = Transformer(replace(cfg.model, vocab_size=len(data.vocabulary), dropout=0.0))
        reference = Transformer(replace(cfg.model, vocab_size=len(data.vocabulary), dropout=0.0))
        reference.load_state_dict(model.state_dict())
        batches = token_batches(data.train.src_lengths, data.train.tgt_lengths, 700, seed=1, epoch=0)
        ddp = torch.nn.parallel.DistributedDataParallel(LabelSmoothedObjective(model, 0.1))
        train_step(ddp, [collate(data.train, batches[rank], data.vocabulary.specials)], context)  # this rank's share
        if rank == 0:  # one process, both batches, accumulated
            both = [collate(data.train, batches[i], data.vocabulary.specials) for i in (0, 1)]
            train_step(LabelSmoothedObjective(reference, 0.1), both)
            worst = max((p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))
            largest = max(q.grad.abs().max().item() for q in reference.parameters())
            results.put((worst, largest))
    finally:
        distributed.shutdown(context)


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes: two ranks equal one with accumulation, end to end: test_two_processes_equal_one_process_with_accumulation
def test_ddp_gradients_equal_accumulated_gradients(tmp_path):
    need(MULTI30K)
    worst, largest = gloo_pair(_gradient_worker, SMALL + [f"data.cache_dir={tmp_path}/cache", f"run_dir={tmp_path}/run"])
    assert largest > 1e-3 and worst < 1e-6 + 1e-5 * largest, (worst, largest)


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes: two ranks writing one checkpoint: test_launcher
def test_two_nodes_on_loopback_write_one_checkpoint(tmp_path):
    need(MULTI30K)
    port = free_port()
    overrides = small_run(tmp_path, "train.max_steps=2")
    nodes = [
        start([*TORCHRUN, "--nnodes=2", f"--node_rank={rank}", "--nproc_per_node=1", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=translate-test", "-m", "translate", "train", *overrides])
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=600) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert (tmp_path / "run" / "checkpoint_last.pt").is_file()
    assert sorted(p.name for p in (tmp_path / "run").glob("*.pt")) == ["checkpoint_2.pt", "checkpoint_last.pt"]


# Rank 1 fails on its second update (through a sitecustomize that only this test installs).
FAIL_ON_RANK_1 = in_update(2, "raise RuntimeError('injected failure on rank 1')", rank=1)


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes on an AVX2 Zen 1: a rank that dies ends the job: test_watchdog
def test_a_failing_rank_ends_the_job(tmp_path):
    """Rank 1's error is its own line, and rank 0 names it at once (the watchdog's beats carry
    it) instead of waiting in its collective until torchrun's grace period ends it."""
    need(MULTI30K)
    started = time.monotonic()
    result = run(torchrun("train", *small_run(tmp_path, "train.max_steps=50")), env=hook_env(tmp_path, FAIL_ON_RANK_1))
    seconds = time.monotonic() - started
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("translate train: error:")]
    assert any("RuntimeError: injected failure on rank 1" in line and "rank" not in line.split("error:")[1][:6]
               for line in errors), result.stderr[-3000:]
    named = [line for line in errors if line.startswith("translate train: error: rank 1")]
    assert len(named) == 1 and re.search(r"failed while update \d+: forward and backward: RuntimeError: injected failure "
                                         r"on rank 1; rank 0 stops too", named[0]), result.stderr[-3000:]
    assert seconds < 60, seconds  # torchrun's grace period alone is 30 s


@pytest.mark.slow
def test_compiled_ddp_with_accumulation_equals_one_eager_process(tmp_path):
    """train.compile=true under DDP: compiled after wrapping (the compiler splits the graph at
    DDP's buckets), and no_sync reached through the compiled wrapper for accumulation."""
    need(MULTI30K)
    common = SMALL + EXACT + [f"data.cache_dir={tmp_path}/cache", "train.tokens_per_update=3200", "train.max_steps=2"]
    one = run(cli("train", *common, f"run_dir={tmp_path}/one"))
    assert one.returncode == 0, one.stderr
    two = run(torchrun("train", *common, "train.compile=true", f"run_dir={tmp_path}/two"))
    assert two.returncode == 0, two.stderr
    assert "x 2 accumulation x 2 processes" in two.stderr
    a, b = weights(tmp_path / "one" / "checkpoint_last.pt"), weights(tmp_path / "two" / "checkpoint_last.pt")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)


class FakeJobEnvironment:
    """What distributed.submitit_launch reads from submitit.JobEnvironment."""

    def __init__(self, job_id, nodes, tasks, rank, local_rank, hostnames):
        self.raw_job_id, self.num_nodes, self.num_tasks = job_id, nodes, tasks
        self.global_rank, self.local_rank, self.hostnames = rank, local_rank, hostnames


def test_submitit_ranks_and_rendezvous_from_a_faked_job_environment():
    from translate.training.distributed import Launch, submitit_launch

    two_nodes = FakeJobEnvironment("4312345", 2, 16, 9, 1, ["gpu017", "gpu018"])
    assert submitit_launch(two_nodes) == Launch(9, 16, 1, "gpu017", 20000 + 4312345 % 12000)
    one_node = FakeJobEnvironment("12777", 1, 2, 1, 1, ["vm"])
    assert submitit_launch(one_node) == Launch(1, 2, 1, "127.0.0.1", 20777)
    # Every task of a job agrees on the port, whatever its rank; another job gets another one.
    ports = {submitit_launch(FakeJobEnvironment("4312345_7", 2, 16, r, r % 8, ["a", "b"])).master_port for r in range(16)}
    assert len(ports) == 1 and 20000 <= ports.pop() < 32768  # below the ephemeral ports
    assert submitit_launch(FakeJobEnvironment("778", 1, 2, 0, 0, ["vm"])).master_port != 20777


def test_submitit_ranks_from_slurm_variables(monkeypatch):
    """Through submitit's own JobEnvironment, as in a task of a 2-node SLURM job."""
    from translate.training.distributed import Launch, _submitit_launch

    for name in [n for n in os.environ if n.startswith(("SLURM_", "SUBMITIT_"))]:
        monkeypatch.delenv(name)
    assert _submitit_launch() is None  # not a submitit task
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    for name, value in dict(SLURM_JOB_ID="4312345", SLURM_NTASKS="16", SLURM_PROCID="9", SLURM_LOCALID="1",
                            SLURM_NODEID="1", SLURM_JOB_NUM_NODES="2", SLURM_JOB_NODELIST="gpu[017-018]").items():
        monkeypatch.setenv(name, value)
    assert _submitit_launch() == Launch(9, 16, 1, "gpu017", 20000 + 4312345 % 12000)


def test_without_submitit_or_torchrun_one_process_and_no_submitit_import():
    code = ("import os, sys\n"
            "for name in [n for n in os.environ if n.startswith(('SUBMITIT_', 'RANK', 'WORLD_SIZE'))]: del os.environ[name]\n"
            "from translate.training import distributed\n"
            "context = distributed.init()\n"
            "print(context.world_size, 'submitit' in sys.modules)\n")
    result = run([sys.executable, "-c", code])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "False"]


def _collectives_worker(rank, port, overrides, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    from translate.training import distributed

    context = distributed.init()
    try:
        summed = distributed.all_sum([rank + 1.0, 2.0], context)
        told = distributed.from_main({"update": 7, "why": None} if rank == 0 else "not rank 0", context)
        gathered = distributed.gather_objects({"rank": rank, "state": torch.arange(3) * rank}, context)
        held = len(distributed._held)
    finally:
        distributed.shutdown(context)
    if rank == 0:
        results.put((summed, told, [(g["rank"], g["state"].tolist()) for g in gathered], held, len(distributed._held)))


def test_the_collectives_hold_their_tensors_until_the_group_is_left():
    """all_sum, from_main and gather_objects give every process the same answer, and keep their
    host tensors until the process group is left (gloo's threads then never free a tensor Python
    made: the destructor that waits for them holds the GIL, and a sweep's job end hung on it)."""
    summed, told, gathered, held, after = gloo_pair(_collectives_worker, [])
    assert summed == [3.0, 4.0] and told == {"update": 7, "why": None}
    assert gathered == [(0, [0, 0, 0]), (1, [0, 1, 2])]
    assert held >= 5 and after == 0
