"""Batches by token budget over length-sorted pairs (paper, section 5.1), and padding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np
import torch

from translate.data.cache import EncodedSplit
from translate.data.vocabulary import SpecialIds


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor's copy on the device that does not make the host wait for the device: a
    copy from pageable memory first waits for all queued device work, one from pinned memory
    does not."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


@dataclass
class Batch:
    """Padded tensors of one batch; targets are teacher-forced (shifted right by one)."""

    src: torch.Tensor  # (B, S) source ids + EOS, right-padded with pad
    tgt_in: torch.Tensor  # (B, T) BOS + target ids: the decoder's input
    tgt_out: torch.Tensor  # (B, T) target ids + EOS: what the decoder must predict
    indices: np.ndarray  # (B,) positions of the pairs in the split
    pad: int  # the padding id (the vocabulary's)

    def real_targets(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """Flat positions (N,) of the real target tokens in tgt_out viewed as (B*T,), and those
        tokens (N,). Found on the host, so that the device never has to stop to tell how many
        there are (boolean indexing there would wait for it); in numpy, single-threaded, as that
        is faster than torch's boolean indexing on the host (scripts/bench_data.py, real_targets)."""
        tgt_out = self.tgt_out.numpy()  # (B, T), shares memory
        select = np.flatnonzero(tgt_out != self.pad)  # (N,)
        return torch.from_numpy(select), torch.from_numpy(tgt_out.ravel()[select])

    def objective_inputs(self, device: torch.device) -> Tuple[torch.Tensor, ...]:
        """What LabelSmoothedObjective takes, on the device: src (B, S), tgt_in (B, T), and the
        real target positions and tokens (N,) each (real_targets; tgt_out itself stays here)."""
        return tuple(to_device(t, device) for t in (self.src, self.tgt_in, *self.real_targets()))

    @property
    def target_tokens(self) -> int:
        return int(np.count_nonzero(self.tgt_out.numpy() != self.pad))

    @property
    def padded_tokens(self) -> int:
        """Source and target positions, padding included."""
        return self.src.numel() + self.tgt_out.numel()

    @property
    def real_tokens(self) -> int:
        return int(np.count_nonzero(self.src.numpy() != self.pad)) + self.target_tokens


def token_batches(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, tokens_per_batch: int, seed: int, epoch: int
) -> List[np.ndarray]:
    """Partition all pairs into batches of similar length, in a seeded random order.

    A batch of n pairs whose longest side is L tokens (BOS/EOS included) holds n * L padded
    tokens on each side; it never exceeds tokens_per_batch, except a single pair longer than
    the budget, which forms a batch of its own. Every pair appears in exactly one batch.
    """
    rng = np.random.default_rng([seed, epoch])
    lengths = np.maximum(src_lengths, tgt_lengths) + 1  # + EOS (source/output) or BOS (input)
    # Random tie-breaking among equal lengths, so batches differ from epoch to epoch.
    shuffled = rng.permutation(len(lengths))
    order = shuffled[np.lexsort((src_lengths[shuffled] + 0, tgt_lengths[shuffled], lengths[shuffled]))]
    batches: List[np.ndarray] = []
    start = 0
    sorted_lengths = lengths[order]
    n = len(order)
    while start < n:
        # Lengths ascend, so the last pair of a candidate batch is its longest.
        longest = sorted_lengths[start]
        size = max(1, tokens_per_batch // longest)
        end = min(n, start + size)
        # Shrink until the longest member fits the budget.
        while end - start > 1 and (end - start) * sorted_lengths[end - 1] > tokens_per_batch:
            end = start + max(1, tokens_per_batch // sorted_lengths[end - 1])
        batches.append(order[start:end])
        start = end
    rng.shuffle(batches)
    return batches


def shard(batches: List[np.ndarray], rank: int, world_size: int) -> List[np.ndarray]:
    """This process's share of an epoch: every world_size-th batch from position rank on, so
    the processes see disjoint batches that together cover the epoch once."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank ({rank}) must be in [0, world_size ({world_size}))")
    return batches[rank::world_size]


class BatchStream:
    """Endless stream of one process's batches (index arrays), reshuffled every epoch, whose
    position can be saved and restored exactly (for resuming). `lengths` holds the (source,
    target) lengths of each segmentation of the pairs that the epochs take in turn (one, or
    data.bpe_dropout's sampled ones: PreparedData.training_lengths)."""

    def __init__(self, lengths: Sequence[Tuple[np.ndarray, np.ndarray]], tokens_per_batch: int, seed: int,
                 rank: int = 0, world_size: int = 1):
        self.lengths = list(lengths)
        self.tokens_per_batch, self.seed, self.rank, self.world_size = tokens_per_batch, seed, rank, world_size
        self.epoch, self.position = 0, 0
        self._batches: List[np.ndarray] | None = None

    def _epoch_batches(self) -> List[np.ndarray]:
        if self._batches is None:
            src_lengths, tgt_lengths = self.lengths[self.epoch % len(self.lengths)]
            batches = token_batches(src_lengths, tgt_lengths, self.tokens_per_batch, self.seed, self.epoch)
            self._batches = shard(batches, self.rank, self.world_size)
        return self._batches

    def __iter__(self) -> "BatchStream":
        return self

    def __next__(self) -> np.ndarray:
        while self.position >= len(self._epoch_batches()):  # (a shard may be empty)
            self.epoch, self.position, self._batches = self.epoch + 1, 0, None
        batch = self._epoch_batches()[self.position]
        self.position += 1
        return batch

    @property
    def completed_epochs(self) -> int:
        """Epochs this stream has served whole: its epoch, and one more once the current one's
        last batch is out (the next batch starts the next epoch)."""
        return self.epoch + int(self.position >= len(self._epoch_batches()))

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position, self._batches = int(state["epoch"]), int(state["position"]), None


def pad(
    tokens: np.ndarray, offsets: np.ndarray, indices: np.ndarray, pad_id: int, prefix: int | None = None,
    suffix: int | None = None,
) -> torch.Tensor:
    """Sentences `indices` of a flat store (sentence i is tokens[offsets[i]:offsets[i+1]]) as a
    right-padded (B, longest + prefix + suffix) int64 tensor, each with an optional first and
    last token: one vectorized gather instead of a Python loop over the sentences."""
    starts = np.asarray(offsets[indices], dtype=np.int64)  # (B,)
    lengths = np.asarray(offsets[indices + 1], dtype=np.int64) - starts  # (B,)
    first = int(prefix is not None)
    width = int(lengths.max(initial=0)) + first + int(suffix is not None)
    out = np.full((len(indices), width), pad_id, dtype=np.int64)
    rows = np.repeat(np.arange(len(indices)), lengths)  # (total,) row of each token
    within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # (total,) position in its row
    out[rows, within + first] = tokens[np.repeat(starts, lengths) + within]
    if prefix is not None:
        out[:, 0] = prefix
    if suffix is not None:
        out[np.arange(len(indices)), lengths + first] = suffix
    return torch.from_numpy(out)


def collate(split: EncodedSplit, indices: np.ndarray, specials: SpecialIds) -> Batch:
    """Source + EOS; target input BOS + target; target output target + EOS; padded with pad
    (the ids of the split's vocabulary)."""
    indices = np.asarray(indices)
    pad_id, bos, eos = specials.pad, specials.bos, specials.eos
    return Batch(
        src=pad(split.src_tokens, split.src_offsets, indices, pad_id, suffix=eos),
        tgt_in=pad(split.tgt_tokens, split.tgt_offsets, indices, pad_id, prefix=bos),
        tgt_out=pad(split.tgt_tokens, split.tgt_offsets, indices, pad_id, suffix=eos),
        indices=indices,
        pad=pad_id,
    )
