"""Two processes in a gloo process group see disjoint batches that cover the epoch once."""

import torch.distributed as dist
import torch.multiprocessing as mp

from tests.conftest import MULTI30K, SMALL, free_port, need


def _worker(rank, world_size, port, overrides, results):
    from translate.hydra_cli import load_config
    from translate.data.prepare import prepare
    from translate.data.batching import BatchStream

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        cfg = load_config("train", overrides)
        data = prepare(cfg.data, log=lambda _: None)  # both prepare: the lock lets one build
        stream = BatchStream(data.train.src_lengths, data.train.tgt_lengths, cfg.train.tokens_per_batch, cfg.train.seed,
                             rank, world_size)
        from translate.data.batching import token_batches

        per_epoch = len(token_batches(data.train.src_lengths, data.train.tgt_lengths, cfg.train.tokens_per_batch, cfg.train.seed, 0))
        mine = [next(stream) for _ in range(len(range(rank, per_epoch, world_size)))]
        gathered = [None] * world_size
        dist.all_gather_object(gathered, [m.tolist() for m in mine])
        if rank == 0:
            results.put((gathered, len(data.train)))
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_cover_the_epoch_once(tmp_path):
    need(MULTI30K)
    overrides = SMALL + [f"run_dir={tmp_path}/run", f"data.cache_dir={tmp_path}/cache"]
    context = mp.get_context("spawn")
    results = context.Queue()
    mp.start_processes(_worker, args=(2, free_port(), overrides, results), nprocs=2, join=True, start_method="spawn")
    gathered, pairs = results.get(timeout=60)
    rank0 = {i for batch in gathered[0] for i in batch}
    rank1 = {i for batch in gathered[1] for i in batch}
    assert not rank0 & rank1
    assert sorted(rank0 | rank1) == list(range(pairs))
    assert sum(len(b) for share in gathered for b in share) == pairs  # each pair exactly once
