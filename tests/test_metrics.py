"""translate.metrics: the Multi30k literature's lowercased tokenized BLEU against a hand
computation of multi-bleu.perl -lc, Moses tokenization where it matters (quotes, apostrophes,
hyphens), and the published test2016 references' own token count."""

import gzip
import math
from collections import Counter

import pytest

from tests.conftest import SHARED_DATA, need
from translate.metrics import corpus_bleu, lowercased_tokenized_bleu, tokenized_bleu

MULTI30K_RAW = SHARED_DATA / "raw" / "multi30k-task1-raw"


def multi_bleu(hypotheses, references):
    """multi-bleu.perl on whitespace tokens, written out: clipped n-gram precisions for n = 1..4
    summed over the corpus, their geometric mean, and the brevity penalty exp(1 - r / c) where
    the hypotheses are shorter; no smoothing (a zero precision gives 0)."""
    matches, totals, c, r = [0] * 4, [0] * 4, 0, 0
    for hyp, ref in zip(hypotheses, references):
        h, t = hyp.split(), ref.split()
        c, r = c + len(h), r + len(t)
        for n in range(1, 5):
            grams = Counter(tuple(h[i : i + n]) for i in range(len(h) - n + 1))
            ref_grams = Counter(tuple(t[i : i + n]) for i in range(len(t) - n + 1))
            matches[n - 1] += sum(min(count, ref_grams[g]) for g, count in grams.items())
            totals[n - 1] += max(len(h) - n + 1, 0)
    if min(matches) == 0:
        return 0.0
    precision = sum(math.log(m / t) for m, t in zip(matches, totals)) / 4
    brevity = 1.0 if c >= r else math.exp(1 - r / c)
    return 100 * brevity * math.exp(precision)


# Raw system output and references, and what lowercasing then Moses tokenization (-l de,
# escaping, no aggressive hyphen splits) makes of them, token by token, by tokenizer.perl's rules.
HYPOTHESES = ['Ein "roter" Hund springt über den Zaun.', "Das ist Peter's rot-weißer Ball!",
              "Eine Frau mit einem T-Shirt & Jeans."]
REFERENCES = ['Ein "roter" Hund springt über einen Zaun.', "Das ist Peters rot-weißer Ball!",
              "Eine Frau in einem T-Shirt & Jeans sitzt."]
TOKENIZED_HYPOTHESES = ["ein &quot; roter &quot; hund springt über den zaun .",  # quotes: escaped, split off
                        "das ist peter &apos; s rot-weißer ball !",  # apostrophe split on both sides (not English)
                        "eine frau mit einem t-shirt &amp; jeans ."]  # hyphens kept inside words
TOKENIZED_REFERENCES = ["ein &quot; roter &quot; hund springt über einen zaun .",
                        "das ist peters rot-weißer ball !",
                        "eine frau in einem t-shirt &amp; jeans sitzt ."]


def test_lowercased_tokenized_bleu_is_multi_bleu_lc_on_moses_tokens():
    score, signature = lowercased_tokenized_bleu(HYPOTHESES, REFERENCES, "de")
    assert score.score == pytest.approx(multi_bleu(TOKENIZED_HYPOTHESES, TOKENIZED_REFERENCES), abs=1e-9)
    assert score.sys_len == 26 and score.ref_len == 25  # the tokens above
    assert "tok:none" in str(signature) and "smooth:none" in str(signature)


def test_case_counts_only_in_the_cased_scores():
    shouted = [line.title() for line in REFERENCES]  # (upper() would turn ß into SS)
    assert lowercased_tokenized_bleu(shouted, REFERENCES, "de")[0].score == pytest.approx(100.0)
    assert tokenized_bleu(shouted, REFERENCES, "de")[0].score < 30
    assert corpus_bleu(shouted, REFERENCES)[0].score < 30
    score, signature = corpus_bleu(shouted, REFERENCES, lowercase=True)  # sacreBLEU -lc
    assert score.score == pytest.approx(100.0) and "case:lc" in str(signature)


def test_the_hand_computation_by_hand():
    """multi_bleu itself, on two lines counted by hand: 8 hypothesis tokens against 9 reference
    tokens; n-gram matches 7/8, 5/6, 3/4, 1/2; BP exp(1 - 9/8)."""
    expected = 100 * math.exp(1 - 9 / 8) * (7 / 8 * 5 / 6 * 3 / 4 * 1 / 2) ** 0.25
    assert multi_bleu(["a b c d e", "x y z"], ["a b c d f", "x y z w"]) == pytest.approx(expected)


def test_test2016_references_tokenize_to_the_published_token_count():
    """Wu et al. (2021), README-baseline.md of LividWo/Revisit-MMT: test2016 BLEU4 41.02 with
    reflen=12103. Our raw references, lowercased and tokenized as lowercased_tokenized_bleu
    does, have exactly that many tokens (tokenizer.perl's own rule for a line's last word would
    make 12,104)."""
    need(MULTI30K_RAW)
    with gzip.open(MULTI30K_RAW / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as file:
        references = file.read().splitlines()
    score, _ = lowercased_tokenized_bleu(references, references, "de")
    assert len(references) == 1000 and score.ref_len == 12103 and score.score == pytest.approx(100.0)
