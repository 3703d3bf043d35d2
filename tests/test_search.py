"""translate/search.py driven by hand-set probability tables (as fairseq's
tests/test_sequence_generator.py), and by a small random Transformer for invariances."""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import pytest
import torch

from tests.conftest import greedy_reference
from translate.core.config import DecodeConfig, ModelConfig
from translate.model import Transformer
from translate.search import Hypothesis, Symbols, beam_search, length_penalty

PAD, UNK, BOS, EOS, W1, W2 = range(6)
VOCAB = 6


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread (see conftest.one_thread)


Table = Dict[Tuple[int, ...], Dict[int, float]]  # prefix (generated tokens, no BOS) -> {token: prob}


def beam(step, state, max_lengths, beam_size: int, alpha: float, banned: Sequence[int] = ()) -> List[List[Hypothesis]]:
    """beam_search with decode's settings for this beam and alpha."""
    settings = DecodeConfig(beam_size=beam_size, length_penalty=alpha)
    return beam_search(step, state, max_lengths, settings, Symbols(BOS, EOS, tuple(banned)))


def greedy(step, state, max_lengths: Sequence[int], banned: Sequence[int] = ()) -> List[List[int]]:
    return greedy_reference(step, state, max_lengths, Symbols(BOS, EOS, tuple(banned)))


class TableState:
    """Per row: the sentence it belongs to and the tokens fed so far (BOS first)."""

    def __init__(self, sentence: torch.Tensor, prefix: torch.Tensor):
        self.sentence = sentence  # (N,)
        self.prefix = prefix  # (N, t)

    def reorder(self, index: torch.Tensor, group=None) -> "TableState":
        return TableState(self.sentence.index_select(0, index), self.prefix.index_select(0, index))


def table_search(tables: Sequence[Table], default: Optional[Dict[int, float]] = None):
    """A step function and start state over one probability table per sentence.

    Tokens a row's table entry leaves out get probability 0; a prefix the table leaves out
    gets `default` (EOS for sure unless given)."""
    default = default or {EOS: 1.0}

    def step(last: torch.Tensor, state: TableState) -> torch.Tensor:
        step.calls += 1
        state.prefix = torch.cat([state.prefix, last[:, None]], dim=1)
        out = torch.full((len(last), VOCAB), float("-inf"))
        for row in range(len(last)):
            tokens = state.prefix[row].tolist()
            assert tokens[0] == BOS
            probs = tables[int(state.sentence[row])].get(tuple(tokens[1:]), default)
            for token, p in probs.items():
                out[row, token] = math.log(p) if p > 0 else float("-inf")
        return out

    step.calls = 0  # how many steps the search took
    start = TableState(torch.arange(len(tables)), torch.zeros(len(tables), 0, dtype=torch.long))
    return step, start


# Two sentences (fairseq's test_with_normalization, keyed by prefix instead of beam row).
SENTENCE_0: Table = {
    (): {W1: 0.9, W2: 0.1},
    (W1,): {EOS: 1.0},  # w1 </s>: 0.9, finishes at step 1
    (W2,): {W1: 0.9, W2: 0.1},
    (W2, W1): {W1: 0.1, W2: 0.9},
    (W2, W2): {EOS: 0.6, W1: 0.2, W2: 0.2},  # w2 w2 </s>: 0.006, ranks 3rd: not finished
    (W2, W1, W2): {EOS: 1.0},  # w2 w1 w2 </s>: 0.081
    (W2, W1, W1): {EOS: 1.0},  # w2 w1 w1 </s>: 0.009, second EOS when 2 are done: dropped
}
SENTENCE_1: Table = {
    (): {W1: 0.7, W2: 0.3},
    (W1,): {EOS: 0.25, W1: 0.35, W2: 0.4},  # w1 </s>: 0.175 ranks 4th: not finished
    (W2,): {W1: 0.1, W2: 0.9},
    (W1, W2): {EOS: 0.6, W1: 0.4},  # w1 w2 </s>: 0.168, ranks 2nd: finished at step 2
    (W2, W2): {EOS: 0.01, W2: 0.99},
    (W2, W2, W2): {EOS: 0.1, W1: 0.5, W2: 0.4},
    (W1, W2, W1): {EOS: 1.0},  # w1 w2 w1 </s>: 0.112, ranks 2nd at step 3: finished, done
}


def lp(length: int, alpha: float) -> float:
    """GNMT penalty written out: ((5 + |Y|) / 6) ** alpha, |Y| counting EOS."""
    return ((5 + length) / 6) ** alpha


def test_length_penalty_formula():
    """length_penalty(n, alpha) == ((5 + n) / 6) ** alpha."""
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(7, 0.6) == pytest.approx(2.0**0.6)
    assert length_penalty(13, 1.0) == pytest.approx(3.0)
    assert length_penalty(30, 0.0) == 1.0


def test_beam_two_sentences_exact_tokens_and_scores():
    """Beam 2, alpha 0.6, two sentences: hypotheses, log-probs and normalized scores by hand."""
    step, state = table_search([SENTENCE_0, SENTENCE_1])
    result = beam(step, state, [10, 10], 2, 0.6)
    assert len(result) == 2
    assert step.calls == 4  # both sentences have 2 finished hypotheses after step 3: stop early

    first = result[0]
    assert [h.tokens for h in first] == [[W1], [W2, W1, W2]]
    assert first[0].log_prob == pytest.approx(math.log(0.9 * 1.0), abs=1e-5)  # -0.10536
    assert first[1].log_prob == pytest.approx(math.log(0.1 * 0.9 * 0.9 * 1.0), abs=1e-5)  # -2.51331
    assert first[0].score == pytest.approx(math.log(0.9) / lp(2, 0.6), abs=1e-5)
    assert first[0].score == pytest.approx(-0.0961, abs=1e-4)
    assert first[1].score == pytest.approx(math.log(0.081) / lp(4, 0.6), abs=1e-5)
    assert first[1].score == pytest.approx(-1.9706, abs=1e-4)

    second = result[1]
    assert [h.tokens for h in second] == [[W1, W2], [W1, W2, W1]]
    assert second[0].log_prob == pytest.approx(math.log(0.7 * 0.4 * 0.6), abs=1e-5)  # -1.78379
    assert second[1].log_prob == pytest.approx(math.log(0.7 * 0.4 * 0.4 * 1.0), abs=1e-5)  # -2.18926
    assert second[0].score == pytest.approx(math.log(0.168) / lp(3, 0.6), abs=1e-5)
    assert second[0].score == pytest.approx(-1.5010, abs=1e-4)
    assert second[1].score == pytest.approx(math.log(0.112) / lp(4, 0.6), abs=1e-5)
    assert second[1].score == pytest.approx(-1.7165, abs=1e-4)


# The short hypothesis (w2 </s>, 0.405) is more probable than the long one
# (w1 w1 w1 </s>, 0.35); only a length penalty makes the long one win.
PENALTY: Table = {
    (): {EOS: 0.05, W1: 0.5, W2: 0.45},
    (W1,): {W1: 1.0},
    (W2,): {EOS: 0.9, W1: 0.1},  # w2 </s>: 0.405, finished at step 1
    (W1, W1): {W1: 1.0},
    (W2, W1): {W2: 1.0},
    (W1, W1, W1): {EOS: 0.7, W1: 0.3},  # w1 w1 w1 </s>: 0.35, finished at step 3
    (W2, W1, W2): {W1: 1.0},
}


@pytest.mark.parametrize(
    "alpha,best,scores",
    [
        # alpha 0: the raw log-probs: log 0.405 = -0.9039 beats log 0.35 = -1.0498.
        (0.0, [W2], [-0.9039, -1.0498]),
        # alpha 1: -0.9039 / (7/6) = -0.7748 loses to -1.0498 / (9/6) = -0.6999.
        (1.0, [W1, W1, W1], [-0.6999, -0.7748]),
        # alpha 2: -0.9039 / (7/6)^2 = -0.6641 loses to -1.0498 / (9/6)^2 = -0.4666.
        (2.0, [W1, W1, W1], [-0.4666, -0.6641]),
    ],
)
def test_length_penalty_changes_the_winner(alpha, best, scores):
    """alpha = 0 prefers the shorter hypothesis; a large alpha the longer, less probable one."""
    step, state = table_search([PENALTY])
    [hypotheses] = beam(step, state, [10], 2, alpha)
    assert sorted(h.tokens for h in hypotheses) == [[W1, W1, W1], [W2]]
    assert step.calls == 4  # early termination, well before the limit of 10
    assert hypotheses[0].tokens == best
    assert [h.score for h in hypotheses] == pytest.approx(scores, abs=1e-4)
    by_tokens = {tuple(h.tokens): h for h in hypotheses}
    assert by_tokens[(W2,)].log_prob == pytest.approx(math.log(0.45 * 0.9), abs=1e-5)
    assert by_tokens[(W1, W1, W1)].log_prob == pytest.approx(math.log(0.5 * 1.0 * 1.0 * 0.7), abs=1e-5)
    assert by_tokens[(W2,)].score == pytest.approx(math.log(0.405) / lp(2, alpha), abs=1e-5)
    assert by_tokens[(W1, W1, W1)].score == pytest.approx(math.log(0.35) / lp(4, alpha), abs=1e-5)


@pytest.mark.parametrize("tables", [[SENTENCE_0, SENTENCE_1], [PENALTY]], ids=["two-sentences", "penalty"])
def test_beam_one_equals_greedy_on_tables(tables):
    """Beam size 1 follows the most probable token at each step, as greedy search does."""
    step, state = table_search(tables)
    greedy_tokens = greedy(step, state, [10] * len(tables))
    step, state = table_search(tables)
    found = beam(step, state, [10] * len(tables), 1, 0.6)
    assert [hypotheses[0].tokens for hypotheses in found] == greedy_tokens
    assert all(len(hypotheses) == 1 for hypotheses in found)
    expected = {2: [[W1], [W1, W2]], 1: [[W1, W1, W1]]}[len(tables)]
    assert greedy_tokens == expected


# Every prefix: EOS is never the best token (nor the second best).
NEVER_EOS = {EOS: 0.1, W1: 0.6, W2: 0.3}


@pytest.mark.parametrize("beam_size", [1, 2])
def test_max_length_forces_eos(beam_size):
    """A table that never prefers EOS yields max_length - 1 tokens, then a forced EOS."""
    max_lengths = [4, 1, 6]
    step, state = table_search([{}, {}, {}], default=NEVER_EOS)
    result = beam(step, state, max_lengths, beam_size, 0.6)
    for hypotheses, limit in zip(result, max_lengths):
        assert hypotheses, "every sentence gets a hypothesis"
        assert all(len(h.tokens) == limit - 1 for h in hypotheses)
        assert hypotheses[0].tokens == [W1] * (limit - 1)
        assert hypotheses[0].log_prob == pytest.approx((limit - 1) * math.log(0.6) + math.log(0.1), abs=1e-5)
        assert hypotheses[0].score == pytest.approx(hypotheses[0].log_prob / lp(limit, 0.6), abs=1e-5)
    step, state = table_search([{}, {}, {}], default=NEVER_EOS)
    assert greedy(step, state, max_lengths) == [[W1] * 3, [], [W1] * 5]


def test_banned_tokens_are_never_produced():
    """With w1 (the most probable token) banned, it appears in no hypothesis."""
    favourite = {EOS: 0.2, W1: 0.5, W2: 0.3}
    step, state = table_search([{}], default=favourite)
    [hypotheses] = beam(step, state, [5], 2, 0.6, banned=[W1])
    # Step 0: w2 0.3, </s> 0.2 (finished); step 1: w2 w2 0.09, w2 </s> 0.06 (finished): done.
    assert [h.tokens for h in hypotheses] == [[], [W2]]
    assert [h.log_prob for h in hypotheses] == pytest.approx([math.log(0.2), math.log(0.3 * 0.2)], abs=1e-5)
    assert [h.score for h in hypotheses] == pytest.approx([-1.6094, -2.5649], abs=1e-4)
    step, state = table_search([{}], default=favourite)
    assert greedy(step, state, [5], banned=[W1]) == [[W2] * 4]
    step, state = table_search([{}], default=favourite)  # unbanned, w1 is everywhere
    assert greedy(step, state, [5]) == [[W1] * 4]


# --- with a real (random, small) model --------------------------------------------------

MODEL_VOCAB = 24


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, d_ff=64, heads=4, layers=2, dropout=0.0, vocab_size=MODEL_VOCAB)
    return Transformer(cfg, pad_id=PAD).eval()


def sources(lengths, seed: int) -> torch.Tensor:
    """(B, max length) random ids, EOS last, PAD after."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD)
    for row, length in enumerate(lengths):
        src[row, : length - 1] = torch.randint(W1, MODEL_VOCAB, (length - 1,), generator=g)
        src[row, length - 1] = EOS
    return src


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_beam_one_equals_greedy_on_model(model, seed):
    """Beam 1 over model.step/start_state gives greedy search's tokens."""
    src = sources([5, 8, 3], seed)
    max_lengths = [7, 10, 5]
    banned = (PAD, BOS, UNK)
    greedy_tokens = greedy(model.step, model.start_state(src), max_lengths, banned=banned)
    found = beam(model.step, model.start_state(src), max_lengths, 1, 0.6, banned=banned)
    assert [hypotheses[0].tokens for hypotheses in found] == greedy_tokens
    assert any(greedy_tokens)
    for tokens in greedy_tokens:
        assert not set(tokens) & set(banned)


def eos_biased(model: Transformer, bias: float):
    """model.step with `bias` added to EOS's log-prob: a random model then ends hypotheses
    at many lengths instead of always at the limit."""
    shift = torch.zeros(MODEL_VOCAB)
    shift[EOS] = bias
    return lambda last, state: model.step(last, state) + shift


@pytest.mark.parametrize("eos_bias", [0.0, 2.5])
@pytest.mark.parametrize("beam_size", [2, 4])
def test_beam_search_independent_of_batch(model, beam_size, eos_bias):
    """Searching sentences one by one equals searching them together, padding and all."""
    lengths = [6, 3, 9, 4]
    src = sources(lengths, seed=7)
    max_lengths = [length + 3 for length in lengths]
    banned = (PAD, BOS, UNK)
    step = eos_biased(model, eos_bias)
    together = beam(step, model.start_state(src), max_lengths, beam_size, 0.6, banned)
    for row, length in enumerate(lengths):
        [alone] = beam(step, model.start_state(src[row : row + 1, :length]), [max_lengths[row]], beam_size, 0.6, banned)
        assert [h.tokens for h in alone] == [h.tokens for h in together[row]]
        assert [h.log_prob for h in alone] == pytest.approx([h.log_prob for h in together[row]], abs=1e-4)
        assert [h.score for h in alone] == pytest.approx([h.score for h in together[row]], abs=1e-4)
        assert len(alone) == beam_size
        assert [h.score for h in alone] == sorted((h.score for h in alone), reverse=True)
        for h in alone:
            assert not set(h.tokens) & set(banned)
            assert len(h.tokens) < max_lengths[row]
    if eos_bias:  # the biased search does finish hypotheses before the limit
        assert any(len(h.tokens) < limit - 1 for hs, limit in zip(together, max_lengths) for h in hs)


@pytest.mark.parametrize("R, V, count", [(4, 8000, 8), (1, 8000, 8), (4, 37, 8), (2, 6, 4), (3, 120, 6)])
def test_best_continuations_equal_a_top_k_of_every_sum(R, V, count):
    """_best_continuations (the top chunks' sums alone, the new path) gives the scores and
    indices of a top-k over every hypothesis score plus token log-prob (the old path), banned
    tokens and sentences forced to EOS included (their -inf ties aside)."""
    from translate.search import _allowed, _best_continuations

    g = torch.Generator().manual_seed(R * V)
    B = 5
    log_probs = torch.randn(B * R, V, generator=g).mul_(3).log_softmax(-1)  # (B*R, V)
    scores = -torch.rand(B, R, generator=g) * 10  # (B, R)
    at_limit = torch.tensor([False, True, False, False, True])
    allowed = _allowed(log_probs.clone(), B, count // 2, banned=torch.tensor([0, 1]), at_limit=at_limit, eos=EOS)
    want_scores, want_index = (allowed + scores[:, :, None]).view(B, R * V).topk(count, dim=1)
    got_scores, got_index = _best_continuations(allowed, scores, count)
    assert torch.equal(got_scores, want_scores)
    finite = torch.isfinite(want_scores)
    assert torch.equal(got_index[finite], want_index[finite])
    assert (allowed.view(B, R * V).gather(1, got_index)[~finite] == float("-inf")).all()  # any of the tied -inf
    assert (~finite).any()  # the sentences at their limit have fewer finite sums than `count`
