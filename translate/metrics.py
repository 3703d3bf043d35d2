"""Scores of translations against references, each as its convention defines it: sacreBLEU and
chrF (with their signatures), the paper's tokenized BLEU (tensor2tensor's get_ende_bleu.sh:
Moses tokenization, compound splitting for German, multi-bleu), the Multi30k literature's
lowercased tokenized BLEU (multi-bleu.perl -lc on Moses tokens) and sacreBLEU's paired
bootstrap test. The `translate bleu` verb reports them; validation and tune use corpus_bleu.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Dict, List, Tuple

from translate.core.errors import TranslateError

SEED = 12345  # the paired bootstrap's resampling seed (sacreBLEU's own default)
# `perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'` works on UTF-8 bytes: \S is any byte but ASCII
# whitespace, so one match may end inside a character and the next start in it ("ü-ä-ö" splits
# twice, "a-b-c" once); /g resumes after each match, as re.sub does. Hence a bytes pattern.
_COMPOUND = re.compile(rb"(\S)-(\S)")
_FINAL_PERIOD = re.compile(r"\S+\.")  # a word ending in a period, as tokenizer.perl's /^(\S+)\.$/
_DOTS = re.compile(r"\.+")


def corpus_bleu(hypotheses: List[str], references: List[str], lowercase: bool = False) -> Tuple[Any, Any]:
    """sacreBLEU's corpus BLEU (13a tokenization, mixed case; with lowercase, sacreBLEU's -lc):
    (BLEUScore, signature)."""
    from sacrebleu.metrics import BLEU

    _check_aligned(hypotheses, references)
    metric = BLEU(lowercase=lowercase)
    return metric.corpus_score(hypotheses, [references]), metric.get_signature()


def corpus_chrf(hypotheses: List[str], references: List[str]) -> Tuple[Any, Any]:
    """sacreBLEU's chrF (chrF2, character 6-grams): (CHRFScore, signature)."""
    from sacrebleu.metrics import CHRF

    _check_aligned(hypotheses, references)
    metric = CHRF()
    return metric.corpus_score(hypotheses, [references]), metric.get_signature()


def split_compounds(line: str) -> str:
    """tensor2tensor's compound splitting ("rich-text" -> "rich ##AT##-##AT## text"), as perl does it."""
    return _COMPOUND.sub(rb"\1 ##AT##-##AT## \2", line.encode("utf-8")).decode("utf-8")


def moses_tokenize(lines: List[str], lang: str) -> List[str]:
    """Moses tokenizer.perl -l LANG with its defaults (escaping on, no aggressive hyphen splits):
    sacremoses, and tokenizer.perl's rule for a line's last word that sacremoses lacks."""
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)
    return [split_final_period(tokenizer.tokenize(line, escape=True, return_str=True)) for line in lines]


def split_final_period(tokenized: str) -> str:
    """tokenizer.perl splits the period off a line's last word whatever the word ("split last
    words independently as they are unlikely to be non-breaking prefixes"), where sacremoses
    keeps a non-breaking prefix or an abbreviation whole: "Gate 24." -> "Gate 24 .", "etc." ->
    "etc .", "FoxNews.com." -> "FoxNews.com .". A word of dots alone ("...") is left as it is:
    tokenizer.perl has turned it into DOTMULTI by then."""
    head, _, last = tokenized.rpartition(" ")
    if _FINAL_PERIOD.fullmatch(last) and not _DOTS.fullmatch(last):
        return f"{head} {last[:-1]} ." if head else f"{last[:-1]} ."
    return tokenized


def tokenized_bleu(hypotheses: List[str], references: List[str], lang: str) -> Tuple[Any, Any]:
    """The paper's BLEU: Moses-tokenize both sides, split compounds when `lang` is German, then
    multi-bleu.perl's BLEU on the tokens (no further tokenization, no smoothing)."""
    from sacrebleu.metrics import BLEU

    _check_aligned(hypotheses, references)
    hyps, refs = moses_tokenize(hypotheses, lang), moses_tokenize(references, lang)
    if lang == "de":
        hyps, refs = [split_compounds(h) for h in hyps], [split_compounds(r) for r in refs]
    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    return metric.corpus_score(hyps, [refs]), metric.get_signature()


def lowercased_tokenized_bleu(hypotheses: List[str], references: List[str], lang: str) -> Tuple[Any, Any]:
    """The Multi30k literature's BLEU (Wu et al. 2021 and the fairseq recipes it follows): both
    sides lowercased, then Moses-tokenized as sacremoses does (escaping on, no aggressive hyphen
    splits; this turns Multi30k's raw test2016 references into the 12,103 tokens those papers
    score against), then BLEU on the tokens as multi-bleu.perl -lc computes it (no smoothing)."""
    from sacrebleu.metrics import BLEU
    from sacremoses import MosesTokenizer

    _check_aligned(hypotheses, references)
    tokenizer = MosesTokenizer(lang=lang)
    hyps, refs = ([tokenizer.tokenize(line.lower(), escape=True, return_str=True) for line in lines]
                  for lines in (hypotheses, references))
    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    return metric.corpus_score(hyps, [refs]), metric.get_signature()


def paired_bootstrap(baseline: List[str], hypotheses: List[str], references: List[str],
                     samples: int) -> Dict[str, Any]:
    """sacreBLEU's paired bootstrap test (paired_bs, seed SEED) of hypotheses against baseline:
    each system's BLEU with its mean and 95% confidence half-width, and the p-value."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    _check_aligned(baseline, references)
    _check_aligned(hypotheses, references)
    saved_seed, logger = os.environ.get("SACREBLEU_SEED"), logging.getLogger("sacrebleu")
    saved_level = logger.level
    os.environ["SACREBLEU_SEED"] = str(SEED)  # sacreBLEU reads its seed from the environment
    logger.setLevel(logging.WARNING)  # its per-step progress messages
    try:
        test = PairedTest([("baseline", baseline), ("hyp", hypotheses)], {"BLEU": BLEU()}, [references],
                          test_type="bs", n_samples=samples)
        signatures, results = test()
    finally:
        logger.setLevel(saved_level)
        if saved_seed is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = saved_seed
    base, hyp = results["BLEU"]
    p_value = float(hyp.p_value)
    # sacreBLEU counts resampled differences strictly above the real one, so two identical
    # systems get p = 1/(samples+1): no difference is never a significant one.
    differ = hyp.score != base.score
    return {
        "test": "paired bootstrap resampling (sacrebleu.significance.PairedTest, paired_bs)",
        "samples": samples,
        "seed": SEED,
        "signature": str(signatures["BLEU"]),
        "baseline": {"bleu": float(base.score), "mean": float(base.mean), "ci95": float(base.ci)},
        "hyp": {"bleu": float(hyp.score), "mean": float(hyp.mean), "ci95": float(hyp.ci)},
        "p_value": p_value,
        "significant": differ and p_value < 0.05,
    }


def _check_aligned(hypotheses: List[str], references: List[str]) -> None:
    if len(hypotheses) != len(references):
        raise TranslateError(f"{len(hypotheses)} hypotheses but {len(references)} references")
