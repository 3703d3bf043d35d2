"""The `translate bleu` verb: a scoring report of translations against references.

sacreBLEU and chrF (with their signatures), the paper's tokenized BLEU, the Multi30k
literature's lowercased tokenized BLEU (translate.metrics computes each; the data set's
literature_bleu says which of the two its papers report), which newstest2014 variant was
scored and, against a baseline, sacreBLEU's paired bootstrap test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from translate.core import paths, run_record
from translate.core.run_record import Score
from translate.core.choices import LiteratureBleu
from translate.core.config import DataConfig, TranslateConfig
from translate.core.errors import TranslateError
from translate.data.loading import read_lines
from translate.metrics import corpus_bleu, corpus_chrf, lowercased_tokenized_bleu, paired_bootstrap, tokenized_bleu

_VARIANTS = {
    3003: "newstest2014 full (3,003 lines, sacreBLEU wmt14/full)",
    2737: "newstest2014 filtered (2,737 lines, sacreBLEU wmt14)",
}


def variant(lines: int) -> str:
    """Which newstest2014 a reference of this many lines is (sacreBLEU's names), else the count."""
    return _VARIANTS.get(lines, f"{lines:,} lines")


# The key of the score each LiteratureBleu names in the report.
LITERATURE_SCORES = {LiteratureBleu.tokenized: "tokenized_bleu", LiteratureBleu.lowercased: "lowercased_tokenized_bleu"}


def labels(src_lang: str, tgt_lang: str, lines: int = 3003,
           literature: LiteratureBleu = LiteratureBleu.tokenized, lowercased_references: bool = False) -> Dict[str, str]:
    """What each score is comparable to, for this language pair, test set and data set (whose
    papers report `literature`'s tokenized BLEU; see PAPER.md), and whether the references are
    lowercased (as decode writes them for a model of lowercased text, data.lowercase)."""
    pair = f"{src_lang}-{tgt_lang}"
    split = "compound-split" if tgt_lang == "de" else f"no compound splitting: target '{tgt_lang}' is not German"
    tokenized = f"tokenized BLEU (Moses -l {tgt_lang}, {split}"
    sacre = "sacreBLEU (13a, mixed case" + (", but these references are lowercased" if lowercased_references else "")
    if lines not in _VARIANTS:
        tokenized += "; not newstest2014, so not comparable to the paper's figures)"
        sacre += "; not newstest2014, so not comparable to published WMT14 figures)"
    elif pair == "en-de":
        tokenized += ", comparable to the paper's 27.3/28.4 for EN-DE)"
        sacre += ", comparable to fairseq's 28.6 sacreBLEU for big EN-DE; not to the paper's 27.3/28.4)"
    elif pair == "en-fr":
        tokenized += ", comparable to the paper's 38.1/41.8 for EN-FR)"
        sacre += "; not comparable to the paper's tokenized 38.1/41.8 for EN-FR)"
    else:
        tokenized += f"; the paper reports no {pair})"
        sacre += f"; the paper reports no {pair})"
    lowercased = (f"lowercased tokenized BLEU (lowercased, then Moses -l {tgt_lang} as sacremoses, no compound splitting: "
                  + ("the Multi30k literature's, e.g. Wu et al. 2021's text-only Transformer on test2016)"
                     if literature == LiteratureBleu.lowercased else "what the Multi30k literature reports; not this data's)"))
    if literature == LiteratureBleu.lowercased:
        tokenized = tokenized.split(" (")[0] + f" (Moses -l {tgt_lang}, {split}: the paper's convention, not this data's)"
    return {"sacrebleu": sacre, "chrf": "chrF2 (character n-gram F-score; the paper reports none)",
            "tokenized_bleu": tokenized, "lowercased_tokenized_bleu": lowercased}


def score_files(hyp: Path, ref: Path, baseline: Optional[Path], data: DataConfig, samples: int = 1000) -> Dict[str, Any]:
    """Every score of hyp against ref (and the test against baseline, if any) as one dict, for
    translations into data.tgt_lang."""
    src_lang, tgt_lang = data.src_lang, data.tgt_lang
    for path, what in ((hyp, "bleu.hyp"), (ref, "bleu.ref"), (baseline, "bleu.baseline")):
        if path is not None and not path.is_file():
            raise TranslateError(f"no file at {path} ({what})")
    hypotheses, references = read_lines(str(hyp)), read_lines(str(ref))
    if not references:
        raise TranslateError(f"{ref} is empty (bleu.ref)")
    _check_files(hyp, hypotheses, ref, references, "bleu.hyp")
    base_lines = read_lines(str(baseline)) if baseline is not None else None
    if baseline is not None:
        _check_files(baseline, base_lines, ref, references, "bleu.baseline")
    lowercased = all(r == r.lower() for r in references) and any(r != r.upper() for r in references)  # case not scored
    label = labels(src_lang, tgt_lang, len(references), data.literature_bleu, lowercased_references=lowercased)
    scores = {}
    for key, (score, signature) in (("sacrebleu", corpus_bleu(hypotheses, references)),
                                    ("chrf", corpus_chrf(hypotheses, references)),
                                    ("tokenized_bleu", tokenized_bleu(hypotheses, references, tgt_lang)),
                                    ("lowercased_tokenized_bleu", lowercased_tokenized_bleu(hypotheses, references, tgt_lang))):
        scores[key] = {"value": float(score.score), "text": str(score), "signature": str(signature),
                       "label": label[key]}
    return {
        "paths": {"hyp": str(hyp), "ref": str(ref), "baseline": str(baseline) if baseline else None},
        "lines": len(references),
        "variant": variant(len(references)),
        "src_lang": src_lang,
        "tgt_lang": tgt_lang,
        "scores": scores,
        "literature": LITERATURE_SCORES[data.literature_bleu],  # the score this data set's papers report
        "significance": (paired_bootstrap(base_lines, hypotheses, references, samples)
                         if base_lines is not None else None),
    }


def format_text(report: Dict[str, Any]) -> str:
    """The readable report; its first line is the one sacreBLEU line that scripts grep for."""
    scores, hyp = report["scores"], report["paths"]["hyp"]
    sacre = scores["sacrebleu"]
    lines = [f"sacreBLEU {sacre['value']:.2f} ({hyp}, {report['lines']} lines)  {sacre['text']}  "
             f"signature: {sacre['signature']}", f"    {sacre['label']}"]
    for name, key in (("chrF", "chrf"), ("tokenized BLEU", "tokenized_bleu"),
                      ("lowercased tokenized BLEU", "lowercased_tokenized_bleu")):
        score = scores[key]
        lines += [f"{name} {score['value']:.2f}  {score['text']}  signature: {score['signature']}",
                  f"    {score['label']}"]
    lines.append(f"test set: {report['variant']}  (references: {report['paths']['ref']})")
    test = report["significance"]
    if test:
        lines.append(f"paired bootstrap ({test['samples']} resamples, seed {test['seed']}), "
                     f"sacreBLEU with 95% confidence intervals:")
        for who in ("baseline", "hyp"):
            result = test[who]
            lines.append(f"    {who:<8} {result['bleu']:.2f}  (mean {result['mean']:.2f} +/- {result['ci95']:.2f})  "
                         f"{report['paths'][who]}")
        hyp_bleu, base_bleu = test["hyp"]["bleu"], test["baseline"]["bleu"]
        verdict = "significant" if test["significant"] else "not significant"
        verdict = (f"hyp is {'better' if hyp_bleu > base_bleu else 'worse'} than baseline, {verdict} at p < 0.05"
                   if hyp_bleu != base_bleu else "hyp and baseline have the same BLEU: no difference to test")
        lines.append(f"    p = {test['p_value']:.4f}: {verdict}")
    return "\n".join(lines)


def bleu(cfg: TranslateConfig) -> float:
    """Print the scoring report of bleu.hyp (default: decode's output) against bleu.ref
    (bleu.format=text or json) and return its sacreBLEU."""
    settings = cfg.bleu
    hyp = Path(settings.hyp) if settings.hyp else paths.decode_output(cfg)
    ref = Path(settings.ref) if settings.ref else paths.decode_reference(cfg)
    if not hyp.is_file():
        raise TranslateError(f"no translations at {hyp}: run translate decode first, or set bleu.hyp=FILE")
    if not ref.is_file():
        raise TranslateError(f"no references at {ref}: set bleu.ref=FILE")
    baseline = Path(settings.baseline) if settings.baseline else None
    if baseline is not None and not baseline.is_file():
        raise TranslateError(f"no baseline translations at {baseline} (bleu.baseline=FILE)")
    report = score_files(hyp, ref, baseline, cfg.data, settings.bootstrap_samples)
    print(json.dumps(report) if settings.format == "json" else format_text(report))
    run_dir = Path(cfg.run_dir).resolve()
    if hyp.resolve().is_relative_to(run_dir):  # the run's own decode: its record keeps the score
        run_record.record_score(run_dir, scoring(run_dir, hyp, report, cfg))
    return report["scores"]["sacrebleu"]["value"]


def scoring(run_dir: Path, hyp: Path, report: Dict[str, Any], cfg: TranslateConfig) -> Score:
    """The report as the run record keeps it: when, which split (decode's record beside the file
    says, else decode's default name), whether that split is held out (any but the dev split the
    run trained with), and what decode translated it with."""
    decoded = run_record.Decoded.read(hyp)
    relative = hyp.resolve().relative_to(run_dir)
    split = decoded.split if decoded is not None else _default_split(relative, cfg.data.tgt_lang)
    dev = run_record.RunRecord.load(run_dir).setting("data", "valid_split", cfg.data.valid_split)
    return Score(hyp=str(relative), lines=report["lines"], variant=report["variant"], scores=report["scores"],
                 text=format_text({**report, "significance": None}), scored_at=run_record.utc_now(), split=split,
                 held_out=split is not None and split != dev, literature=report["literature"], decoded=decoded)


def _default_split(relative: Path, tgt_lang: str) -> Optional[str]:
    """The split of decode's default output decode/<split>.<tgt_lang>, from its name; else None."""
    if relative.parent != Path(paths.DECODE) or relative.suffix != f".{tgt_lang}":
        return None
    return relative.stem


def _check_files(path: Path, lines: List[str], ref: Path, references: List[str], key: str) -> None:
    if len(lines) != len(references):
        raise TranslateError(f"{path} has {len(lines)} lines but {ref} has {len(references)} "
                             f"({key} and bleu.ref must align line by line)")
