"""Greedy and beam search (paper, section 6.1) over any incremental step function.

The search needs only `step(last_tokens (N,), state) -> log-probs (N, V)` and
`state.reorder(index (N',)) -> state`, so tests can drive it with hand-set probability
tables and the model drives it with its cached decoder step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Protocol, Sequence

import torch
from torch import Tensor


class SearchState(Protocol):
    def reorder(self, index: Tensor) -> "SearchState": ...


StepFunction = Callable[[Tensor, SearchState], Tensor]


@dataclass
class Hypothesis:
    tokens: List[int]  # output ids, without BOS/EOS
    log_prob: float  # sum of token log-probabilities, EOS included
    score: float  # log_prob / length_penalty(len(tokens) + 1)


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty (Wu et al., 2016): ((5 + |Y|) / 6) ** alpha; |Y| counts EOS."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def beam_search(
    step: StepFunction,
    state: SearchState,
    max_lengths: Sequence[int],
    beam_size: int,
    alpha: float,
    bos: int,
    eos: int,
    banned: Sequence[int] = (),
) -> List[List[Hypothesis]]:
    """Batched beam search; returns each sentence's finished hypotheses, best first.

    `state` holds B sentences (one row each); max_lengths[b] bounds the output length of
    sentence b, EOS included, and EOS is forced when it is reached. As in fairseq, each step
    takes the 2K best continuations of the K live hypotheses: EOS among the top K finishes
    a hypothesis (scored with the length penalty), the best K others live on; a sentence is
    done when K hypotheses have finished (early termination).
    """
    B, K = len(max_lengths), beam_size
    device = _device_of(state)
    limit = torch.tensor(list(max_lengths), device=device)  # (B,)
    rows = torch.arange(B, device=device).repeat_interleave(K)  # (B*K,) sentence of each row
    state = state.reorder(rows)
    scores = torch.full((B, K), float("-inf"), device=device)
    scores[:, 0] = 0.0  # one live hypothesis per sentence at the start
    history = torch.full((B * K, 0), bos, dtype=torch.long, device=device)  # (B*K, t)
    last = torch.full((B * K,), bos, dtype=torch.long, device=device)
    finished: List[List[Hypothesis]] = [[] for _ in range(B)]
    done = torch.zeros(B, dtype=torch.bool, device=device)
    beam_offsets = (torch.arange(B, device=device) * K)[:, None]  # (B, 1)

    for t in range(int(limit.max())):
        log_probs = step(last, state)  # (B*K, V)
        V = log_probs.size(-1)
        log_probs = log_probs.clone()
        if banned:
            log_probs[:, list(banned)] = float("-inf")
        at_limit = (limit <= t + 1).repeat_interleave(K)  # (B*K,) only EOS may follow
        if at_limit.any():
            eos_column = log_probs[at_limit, eos].clone()
            log_probs[at_limit] = float("-inf")
            log_probs[at_limit, eos] = eos_column
        candidates = (scores[:, :, None] + log_probs.view(B, K, V)).view(B, K * V)
        top_scores, top_index = candidates.topk(2 * K, dim=1)  # (B, 2K)
        top_beam, top_token = top_index // V, top_index % V  # (B, 2K)

        # Finish EOS continuations that rank among the top K.
        is_eos = top_token == eos
        finish = is_eos[:, :K] & torch.isfinite(top_scores[:, :K]) & ~done[:, None]
        penalty = length_penalty(t + 1, alpha)
        for b, j in finish.nonzero().tolist():
            row = int(beam_offsets[b, 0] + top_beam[b, j])
            log_prob = float(top_scores[b, j])
            if len(finished[b]) < K:
                finished[b].append(Hypothesis(history[row].tolist(), log_prob, log_prob / penalty))
        done |= torch.tensor([len(f) >= K for f in finished], device=device)
        if bool(done.all()):
            break

        # The best K non-EOS continuations live on (there are always at least K).
        rank = torch.arange(2 * K, device=device).expand(B, 2 * K) + is_eos * (2 * K)
        keep = rank.topk(K, dim=1, largest=False).indices  # (B, K) positions among the 2K
        scores = top_scores.gather(1, keep)
        scores[done] = float("-inf")  # finished sentences stop competing
        origin = (beam_offsets + top_beam.gather(1, keep)).view(-1)  # (B*K,) rows they extend
        last = top_token.gather(1, keep).view(-1)
        history = torch.cat([history.index_select(0, origin), last[:, None]], dim=1)
        state = state.reorder(origin)

    for hypotheses in finished:
        hypotheses.sort(key=lambda h: h.score, reverse=True)
    return finished


@torch.no_grad()
def greedy_search(
    step: StepFunction, state: SearchState, max_lengths: Sequence[int], bos: int, eos: int, banned: Sequence[int] = ()
) -> List[List[int]]:
    """The most probable token at each step, until EOS or the length limit (EOS included)."""
    B = len(max_lengths)
    last = torch.full((B,), bos, dtype=torch.long, device=_device_of(state))
    outputs: List[List[int]] = [[] for _ in range(B)]
    finished = [False] * B
    for t in range(max(max_lengths)):
        log_probs = step(last, state).clone()
        if banned:
            log_probs[:, list(banned)] = float("-inf")
        last = log_probs.argmax(dim=-1)
        for b in range(B):
            if finished[b]:
                continue
            if int(last[b]) == eos or t + 1 >= max_lengths[b]:
                finished[b] = True
            else:
                outputs[b].append(int(last[b]))
        if all(finished):
            break
    return outputs


def _device_of(state: SearchState) -> torch.device:
    for value in vars(state).values():
        if isinstance(value, Tensor):
            return value.device
    return torch.device("cpu")
