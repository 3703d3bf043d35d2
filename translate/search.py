"""Beam search (paper, section 6.1) and sampling over any incremental step function.

A search needs only `step(last_tokens (N,), state) -> log-probs (N, V)` and
`state.reorder(index (N',), group) -> state`, so tests can drive it with hand-set probability
tables and the model drives it with its cached decoder step. Its settings are decode's
(DecodeConfig: beam_size, length_penalty, sampling, temperature, top_k, top_p), taken as they
are, so that an option of the search is read here and nowhere between; every search returns
each sentence's hypotheses, best first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Protocol, Sequence, Tuple

import torch
from torch import Tensor

from translate.core.config import DecodeConfig


class SearchState(Protocol):
    def reorder(self, index: Tensor, group: int | None = None) -> "SearchState":
        """Rows `index`; `group`: rows per sentence from now on (a state may share a
        sentence's tensors among them), or None for as before."""
        ...


# step(last_tokens (N,), state) -> log-probs (N, V): a tensor of its own, which beam search
# overwrites (banned tokens, forced EOS).
StepFunction = Callable[[Tensor, SearchState], Tensor]


@dataclass(frozen=True)
class Symbols:
    """The ids a search treats apart: outputs start after bos and end at eos; banned ones are
    never generated (padding, unknown, a second BOS)."""

    bos: int
    eos: int
    banned: Tuple[int, ...] = ()


@dataclass
class Hypothesis:
    tokens: List[int]  # output ids, without BOS/EOS
    log_prob: float  # sum of token log-probabilities, EOS included
    score: float  # log_prob / length_penalty(len(tokens) + 1)


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty (Wu et al., 2016): ((5 + |Y|) / 6) ** alpha; |Y| counts EOS."""
    return ((5.0 + length) / 6.0) ** alpha


def search(step: StepFunction, state: SearchState, max_lengths: Sequence[int], settings: DecodeConfig,
           symbols: Symbols, generator: Optional[torch.Generator] = None) -> List[List[Hypothesis]]:
    """The search `settings` ask for: sampling (one hypothesis per sentence, from `generator`)
    or beam search (beam_size of them)."""
    if settings.sampling:
        return sample(step, state, max_lengths, settings, symbols, generator)
    return beam_search(step, state, max_lengths, settings, symbols)


@torch.no_grad()
def beam_search(step: StepFunction, state: SearchState, max_lengths: Sequence[int], settings: DecodeConfig,
                symbols: Symbols) -> List[List[Hypothesis]]:
    """Batched beam search of settings.beam_size hypotheses with the GNMT length penalty of
    alpha settings.length_penalty; returns each sentence's finished hypotheses, best first.

    `state` holds B sentences (one row each); max_lengths[b] bounds the output length of
    sentence b, EOS included, and EOS is forced when it is reached. As in fairseq, each step
    takes the 2K best continuations of the K live hypotheses: EOS among the top K finishes
    a hypothesis (scored with the length penalty), the best K others live on; a sentence is
    done when K hypotheses have finished (early termination), and its rows leave the batch.
    """
    K, alpha = settings.beam_size, settings.length_penalty
    bos, eos, banned = symbols.bos, symbols.eos, symbols.banned
    device = _device_of(state)
    active = torch.arange(len(max_lengths), device=device)  # (B,) sentence of each live row group
    limit = torch.tensor(list(max_lengths), device=device)  # (B,)
    # R rows (hypotheses) per sentence: the first step has one live hypothesis per sentence,
    # so it runs on one row each; every later step on K.
    R = 1
    scores = torch.zeros(len(active), 1, device=device)  # (B, R)
    history = torch.full((len(active), 0), bos, dtype=torch.long, device=device)  # (B*R, t)
    last = torch.full((len(active),), bos, dtype=torch.long, device=device)  # (B*R,)
    finished: List[List[Hypothesis]] = [[] for _ in max_lengths]
    banned_index = torch.tensor(banned, dtype=torch.long, device=device)

    for t in range(int(limit.max())):
        B = len(active)
        log_probs = _allowed(step(last, state), B, K, banned=banned_index, at_limit=limit <= t + 1, eos=eos)  # (B, R, V)
        V = log_probs.size(-1)
        top_scores, top_index = _best_continuations(log_probs, scores, 2 * K)  # (B, 2K)
        top_beam, top_token = top_index // V, top_index % V  # (B, 2K)
        rows = (torch.arange(B, device=device) * R)[:, None] + top_beam  # (B, 2K) history row each extends

        # Finish EOS continuations that rank among the top K.
        is_eos = top_token == eos
        finish = is_eos[:, :K] & torch.isfinite(top_scores[:, :K])  # (B, K)
        penalty = length_penalty(t + 1, alpha)
        live = _record_finished(finished, active, history, top_scores=top_scores, rows=rows, finish=finish,
                                penalty=penalty, beam_size=K)  # (B,)
        if not bool(live.any()):
            break

        # The best K non-EOS continuations of the unfinished sentences live on; finished ones leave.
        scores, origin, last = _survivors(top_scores, top_token, rows, is_eos, live, K)
        history = torch.cat([history.index_select(0, origin), last[:, None]], dim=1)  # (B'*K, t+1)
        state = state.reorder(origin, K)  # K rows per sentence from the first step on
        active, limit, R = active[live], limit[live], K

    for hypotheses in finished:
        hypotheses.sort(key=lambda h: h.score, reverse=True)
    return finished


def _allowed(log_probs: Tensor, B: int, beam_size: int, *, banned: Tensor, at_limit: Tensor, eos: int) -> Tensor:
    """The step's log_probs (B*R, V) as (B, R, V), in place: the banned tokens at -inf, and only
    EOS left to the sentences at their length limit (at_limit, (B,))."""
    V = log_probs.size(-1)
    if V < 2 * beam_size:
        raise ValueError(f"beam search needs at least 2 x beam_size ({2 * beam_size}) tokens, not {V}")
    log_probs = log_probs.view(B, -1, V)
    if len(banned):
        log_probs.index_fill_(2, banned, float("-inf"))
    _force_eos(log_probs, at_limit, eos)
    return log_probs


def _force_eos(log_probs: Tensor, at_limit: Tensor, eos: int) -> None:
    """In place: for the sentences at their length limit (at_limit, (B,)), every continuation
    but EOS gets -inf in log_probs (B, R, V), so that their hypotheses end now."""
    if at_limit.any():
        eos_column = log_probs[at_limit, :, eos].clone()  # (B_limit, R), before it is overwritten
        log_probs[at_limit] = float("-inf")
        log_probs[at_limit, :, eos] = eos_column


def _best_continuations(log_probs: Tensor, scores: Tensor, count: int) -> Tuple[Tensor, Tensor]:
    """The `count` best one-token continuations of each sentence's R live hypotheses: their
    scores (B, count), best first (a hypothesis's score plus the token's log-prob, log_probs
    (B, R, V) and scores (B, R)), and their flat index r * V + token (B, count).

    The same as a top-k of all R*V sums, found without computing them: the maxima of chunks
    of C tokens rank the chunks (a sum is monotone in its log-prob, and the chunks of the
    `count` best maxima hold at least `count` sums at or above any outside), and only those
    chunks' sums are computed and ranked, a fraction of the full sum and top-k's work. (Among
    exactly equal sums, which comes first may differ from a top-k over all of them.)"""
    B, R, V = log_probs.shape
    # Tokens per chunk: chunks stay within a row, and there are at least `count` of them.
    C = next(c for c in (64, 32, 16, 8, 4, 2, 1) if V % c == 0 and R * V // c >= count)
    chunks = log_probs.reshape(B, R * V // C, C)  # (B, R*V/C, C): chunk j is row j // (V/C)
    maxima = chunks.amax(dim=-1).view(B, R, V // C) + scores[:, :, None]  # (B, R, V/C) each chunk's best sum
    best = maxima.view(B, -1).topk(count, dim=1).indices  # (B, count) chunks
    sums = chunks.gather(1, best[:, :, None].expand(B, count, C))  # (B, count, C) their log-probs
    sums += scores.gather(1, best // (V // C))[:, :, None]  # ... plus their hypothesis's score
    top_scores, within = sums.view(B, count * C).topk(count, dim=1)  # (B, count)
    return top_scores, best.gather(1, within // C) * C + within % C


def _record_finished(
    finished: List[List[Hypothesis]],
    active: Tensor,
    history: Tensor,
    *,
    top_scores: Tensor,
    rows: Tensor,
    finish: Tensor,
    penalty: float,
    beam_size: int,
) -> Tensor:
    """Add the EOS continuations marked in finish (B, K) to their sentence's finished list
    while it holds fewer than beam_size; returns which of the B sentences still need more (B,).

    active (B,): each row group's sentence; history (B*R, t): the live hypotheses' tokens;
    top_scores and rows (B, 2K): each continuation's score and the history row it extends."""
    for b, j in finish.nonzero().tolist():
        hypotheses = finished[int(active[b])]
        if len(hypotheses) < beam_size:
            log_prob = float(top_scores[b, j])
            hypotheses.append(Hypothesis(history[int(rows[b, j])].tolist(), log_prob, log_prob / penalty))
    return torch.tensor([len(finished[int(a)]) < beam_size for a in active.tolist()], device=active.device)


def _survivors(
    top_scores: Tensor, top_token: Tensor, rows: Tensor, is_eos: Tensor, live: Tensor, beam_size: int
) -> Tuple[Tensor, Tensor, Tensor]:
    """The best K non-EOS continuations of each unfinished (live) sentence among its 2K best
    (there are always at least K): their scores (B', K), the history rows they extend (B'*K,)
    and their tokens (B'*K,). Finished sentences leave the batch."""
    K = beam_size
    B = top_scores.size(0)
    rank = torch.arange(2 * K, device=live.device).expand(B, 2 * K) + is_eos * (2 * K)  # (B, 2K) EOS last
    keep = rank.topk(K, dim=1, largest=False).indices[live]  # (B', K) positions among the 2K
    scores = top_scores[live].gather(1, keep)  # (B', K)
    origin = rows[live].gather(1, keep).view(-1)  # (B'*K,) rows extended
    last = top_token[live].gather(1, keep).view(-1)  # (B'*K,)
    return scores, origin, last


@torch.no_grad()
def sample(step: StepFunction, state: SearchState, max_lengths: Sequence[int], settings: DecodeConfig,
           symbols: Symbols, generator: Optional[torch.Generator] = None) -> List[List[Hypothesis]]:
    """One sampled output per sentence from softmax(logits / settings.temperature), optionally
    restricted to the settings.top_k tokens and to the smallest set whose probability reaches
    settings.top_p; each sentence's one hypothesis."""
    temperature, top_k, top_p = settings.temperature, settings.top_k, settings.top_p
    bos, eos, banned = symbols.bos, symbols.eos, symbols.banned
    if temperature <= 0:
        raise ValueError(f"temperature ({temperature}) must be positive")
    B = len(max_lengths)
    last = torch.full((B,), bos, dtype=torch.long, device=_device_of(state))
    outputs: List[List[int]] = [[] for _ in range(B)]
    log_prob = [0.0] * B
    finished = [False] * B
    for t in range(max(max_lengths)):
        logits = step(last, state).clone() / temperature  # (B, V) log-probs, rescaled
        if banned:
            logits[:, list(banned)] = float("-inf")
        if top_k > 0:
            kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (B, 1)
            logits[logits < kth] = float("-inf")
        if top_p < 1.0:
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
            outside = cumulative - sorted_logits.softmax(dim=-1) >= top_p  # mass before this token
            logits.scatter_(1, order, sorted_logits.masked_fill(outside, float("-inf")))
        log_probs = logits.log_softmax(dim=-1)
        for b in range(B):
            if not finished[b] and t + 1 >= max_lengths[b]:  # only EOS may follow
                log_probs[b] = float("-inf")
                log_probs[b, eos] = 0.0
        last = torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(1)  # (B,)
        for b in range(B):
            if finished[b]:
                continue
            token = int(last[b])
            log_prob[b] += float(log_probs[b, token])
            if token == eos:
                finished[b] = True
            else:
                outputs[b].append(token)
        if all(finished):
            break
    return [[Hypothesis(tokens, lp, lp)] for tokens, lp in zip(outputs, log_prob)]



def _device_of(state: SearchState) -> torch.device:
    for value in vars(state).values():
        if isinstance(value, Tensor):
            return value.device
    return torch.device("cpu")
