"""Batches by token budget (translate.data.batching): every pair once per epoch, no batch over
budget, little padding; each process its own share, under a gloo process group too."""

import numpy as np
import pytest
import torch

from tests.conftest import MULTI30K, SMALL, gloo_pair, need
from translate.data.batching import collate, pad, shard, token_batches
from translate.data.cache import EncodedSplit
from translate.data.vocabulary import SpecialIds

PAD, BOS, EOS = 7, 5, 6  # not our layout's ids: the batches must follow the ones given


def random_lengths(n=5000, seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 120, n)
    tgt = np.clip(src + rng.integers(-10, 10, n), 1, None)
    return src, tgt


@pytest.mark.parametrize("budget", [300, 1000, 4096])
def test_every_pair_exactly_once_and_within_budget(budget):
    src, tgt = random_lengths()
    batches = token_batches(src, tgt, budget, seed=1, epoch=0)
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(len(src)))
    for batch in batches:
        longest = int(np.max(np.maximum(src[batch], tgt[batch]))) + 1  # + EOS/BOS
        assert len(batch) * longest <= budget or len(batch) == 1


def test_single_pair_longer_than_budget_gets_its_own_batch():
    batches = token_batches(np.array([5, 500, 7]), np.array([5, 480, 6]), 100, seed=1, epoch=0)
    assert any(b.tolist() == [1] for b in batches)
    assert sorted(np.concatenate(batches).tolist()) == [0, 1, 2]


def test_order_is_seeded_and_changes_between_epochs():
    src, tgt = random_lengths()
    first = token_batches(src, tgt, 1000, seed=3, epoch=0)
    again = token_batches(src, tgt, 1000, seed=3, epoch=0)
    other = token_batches(src, tgt, 1000, seed=3, epoch=1)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(len(a) == len(b) and np.array_equal(a, b) for a, b in zip(first, other))


def test_length_sorting_keeps_padding_low():
    src, tgt = random_lengths(20000)
    batches = token_batches(src, tgt, 4096, seed=1, epoch=0)
    real = sum(int(src[b].sum() + tgt[b].sum()) + 2 * len(b) for b in batches)
    padded = sum(2 * len(b) * (int(np.max(np.maximum(src[b], tgt[b]))) + 1) for b in batches)
    assert 1 - real / padded < 0.10


def test_collate_frames_source_and_teacher_forced_target():
    split = EncodedSplit(
        src_tokens=np.array([10, 11, 12, 20], dtype=np.uint16),
        src_offsets=np.array([0, 3, 4]),
        tgt_tokens=np.array([30, 40, 41], dtype=np.uint16),
        tgt_offsets=np.array([0, 1, 3]),
    )
    batch = collate(split, np.array([0, 1]), SpecialIds(pad=PAD, unk=1, bos=BOS, eos=EOS))
    assert batch.src.tolist() == [[10, 11, 12, EOS], [20, EOS, PAD, PAD]]
    assert batch.tgt_in.tolist() == [[BOS, 30, PAD], [BOS, 40, 41]]
    assert batch.tgt_out.tolist() == [[30, EOS, PAD], [40, 41, EOS]]
    assert batch.target_tokens == 5 and batch.src.dtype == torch.int64
    assert batch.real_tokens == 6 + 5 and batch.padded_tokens == 8 + 6
    select, target = batch.real_targets()
    # Written out by hand: rows of width 3, padding at flat position 2 only.
    assert select.tolist() == [0, 1, 3, 4, 5] and target.tolist() == [30, EOS, 40, 41, EOS]
    assert torch.equal(batch.tgt_out.flatten()[select], target)
    src, tgt_in, *targets = batch.objective_inputs(torch.device("cpu"))
    assert torch.equal(src, batch.src) and torch.equal(tgt_in, batch.tgt_in)
    assert [t.tolist() for t in targets] == [[0, 1, 3, 4, 5], [30, EOS, 40, 41, EOS]]


def padded_by_hand(sequences, pad_id, prefix=None, suffix=None) -> torch.Tensor:
    """The reference: each row built in a Python loop."""
    rows = [([prefix] if prefix is not None else []) + list(map(int, s)) + ([suffix] if suffix is not None else [])
            for s in sequences]
    width = max(map(len, rows))
    return torch.tensor([row + [pad_id] * (width - len(row)) for row in rows], dtype=torch.int64)


def test_pad_equals_padding_by_hand():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 30, 200)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(4, 60000, int(offsets[-1])).astype(np.uint16)
    indices = rng.permutation(200)[:50]
    sequences = [tokens[offsets[i] : offsets[i + 1]] for i in indices]
    for prefix, suffix in ((None, EOS), (BOS, None), (None, None), (BOS, EOS)):
        expected = padded_by_hand(sequences, PAD, prefix=prefix, suffix=suffix)
        assert torch.equal(pad(tokens, offsets, indices, PAD, prefix=prefix, suffix=suffix), expected)


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_shards_are_disjoint_and_cover_the_epoch(world_size):
    src, tgt = random_lengths(3000)
    batches = token_batches(src, tgt, 2000, seed=1, epoch=0)
    shares = [shard(batches, rank, world_size) for rank in range(world_size)]
    seen = np.concatenate([np.concatenate(share) for share in shares if share])
    assert sorted(seen.tolist()) == list(range(3000))
    with pytest.raises(ValueError):
        shard(batches, world_size, world_size)


def _worker(rank, port, overrides, results, world_size=2):
    import torch.distributed as dist

    from translate.data.batching import BatchStream
    from translate.data.preparation import prepare
    from translate.hydra_cli import load_config

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        cfg = load_config("train", overrides)
        data = prepare(cfg.data, log=lambda _: None)  # both prepare: the lock lets one build
        stream = BatchStream([(data.train.src_lengths, data.train.tgt_lengths)], cfg.train.tokens_per_batch, cfg.train.seed,
                             rank, world_size)
        per_epoch = len(token_batches(data.train.src_lengths, data.train.tgt_lengths, cfg.train.tokens_per_batch, cfg.train.seed, 0))
        mine = [next(stream) for _ in range(len(range(rank, per_epoch, world_size)))]
        gathered = [None] * world_size
        dist.all_gather_object(gathered, [m.tolist() for m in mine])
        if rank == 0:
            results.put((gathered, len(data.train)))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # make test-slow, to keep the default suite under 10 minutes: shards cover the epoch once: test_shards_are_disjoint_and_cover_the_epoch; two gloo ranks: test_two_processes_equal_one_process_with_accumulation
def test_two_gloo_processes_cover_the_epoch_once(tmp_path):
    """Two processes in a gloo process group see disjoint batches that cover the epoch once."""
    need(MULTI30K)
    gathered, pairs = gloo_pair(_worker, SMALL + [f"run_dir={tmp_path}/run", f"data.cache_dir={tmp_path}/cache"])
    rank0 = {i for batch in gathered[0] for i in batch}
    rank1 = {i for batch in gathered[1] for i in batch}
    assert not rank0 & rank1
    assert sorted(rank0 | rank1) == list(range(pairs))
    assert sum(len(b) for share in gathered for b in share) == pairs  # each pair exactly once
