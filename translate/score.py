"""The `translate bleu` verb: sacreBLEU of translations against references."""

from __future__ import annotations

from pathlib import Path

from translate import paths
from translate.config import TranslateConfig
from translate.data.loading import read_lines
from translate.errors import TranslateError


def corpus_bleu(hypotheses: list, references: list):
    """sacreBLEU's corpus BLEU (13a tokenization, mixed case) with its signature."""
    from sacrebleu.metrics import BLEU

    if len(hypotheses) != len(references):
        raise TranslateError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    metric = BLEU()
    return metric.corpus_score(hypotheses, [references]), metric.get_signature()


def bleu(cfg: TranslateConfig) -> float:
    """Print and return sacreBLEU of bleu.hyp (default: decode's output) against bleu.ref."""
    hyp = Path(cfg.bleu.hyp) if cfg.bleu.hyp else paths.decode_output(cfg)
    ref = Path(cfg.bleu.ref) if cfg.bleu.ref else paths.decode_reference(cfg)
    if not hyp.is_file():
        raise TranslateError(f"no translations at {hyp}: run translate decode first, or set bleu.hyp=FILE")
    if not ref.is_file():
        raise TranslateError(f"no references at {ref}: set bleu.ref=FILE")
    hypotheses, references = read_lines(str(hyp)), read_lines(str(ref))
    if len(hypotheses) != len(references):
        raise TranslateError(f"{hyp} has {len(hypotheses)} lines but {ref} has {len(references)}")
    score, signature = corpus_bleu(hypotheses, references)
    print(f"sacreBLEU {score.score:.2f} ({hyp}, {len(hypotheses)} lines)  {score}  signature: {signature}")
    return score.score
