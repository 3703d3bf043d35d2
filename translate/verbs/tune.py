"""The `translate tune` verb: the length penalty chosen on the dev split, as the paper chose
alpha "after experimentation on the development set" (section 6.1).

It decodes the dev split once per value of tune.alphas (the beam and output cap of decode),
and beyond the largest while that one is the best (up to tune.extend_to; a choice still at the
edge is named in a warning), prints sacreBLEU and the brevity penalty of each, and writes the
best beside the checkpoint it decoded, bound to the weights it held (<checkpoint>.generation.json:
checkpoint.GenerationSettings); from then on `translate decode`, `export` and `plot` of those
weights use it, unless the command line sets decode.length_penalty (Translator.decoding). The run
record keeps each choice, for the history.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from translate import averaging
from translate.checkpoint import GenerationSettings
from translate.core import paths, run_record
from translate.core.command_line import CommandLine
from translate.core.config import PAPER_LENGTH_PENALTY, TranslateConfig
from translate.core.errors import TranslateError
from translate.data.loading import load_corpus
from translate.metrics import corpus_bleu
from translate.translator import Translator

log = logging.getLogger("translate.verbs.tune")


def tune(cfg: TranslateConfig, command: Optional[CommandLine] = None) -> float:
    """Decode the dev split with each alpha; write the one with the best sacreBLEU (of equal
    scores, the one nearest the paper's 0.6) beside the checkpoint, add it to the run record, and
    return it."""
    path = averaging.chosen_checkpoint(cfg)
    problem = paths.usable_folder(path.parent)  # found before the search, not after it
    if problem:
        raise TranslateError(f"cannot write the chosen settings beside {path}: {problem}")
    translator = Translator.from_checkpoint(path)
    scores, sentences = dev_scores(cfg, translator, path)
    best = best_score(scores)
    print(f"chosen: alpha {best['alpha']} (sacreBLEU {best['sacrebleu']:.2f}, BP {best['bp']:.3f}); "
          f"translate decode uses it unless decode.length_penalty is given")
    assert translator.identity is not None  # read from a checkpoint
    chosen = GenerationSettings(best["alpha"], cfg.decode.beam_size, translator.identity, split=cfg.data.valid_split,
                                sentences=sentences, scores=scores, command=(command or CommandLine("tune")).text())
    log.info(f"wrote {chosen.write(path)}: decode, export and plot of these weights use alpha {best['alpha']}")
    entry = {"alpha": best["alpha"], "split": chosen.split, "sentences": chosen.sentences, "checkpoint": str(path),
             "beam_size": chosen.beam_size, "scores": scores, "command": chosen.command, "weights": chosen.as_dict()["weights"]}
    run_record.record_length_penalty(Path(cfg.run_dir), path, entry)
    return best["alpha"]


def dev_scores(cfg: TranslateConfig, translator: Translator, path: Path) -> Tuple[List[Dict[str, Any]], int]:
    """Every alpha's score on the dev split (tune.alphas, extended while the largest is best)
    for the weights `translator` holds (read from `path`), and how many sentences were decoded;
    writes nothing (scripts/average_windows.py scores other averages of a run with it)."""
    corpus = load_corpus(cfg.data, cfg.data.valid_split)
    sources, references = corpus.pairs()
    references = translator.references(references)
    if cfg.tune.sentences:
        sources, references = sources[:cfg.tune.sentences], references[:cfg.tune.sentences]
    log.info(f"choosing the length penalty on {len(sources):,} sentences of {corpus.description} "
             f"(beam {cfg.decode.beam_size}, checkpoint {path})")
    scores = search_alphas(cfg.tune.alphas, cfg.tune.extend_to,
                           lambda alpha: _score(translator, sources, references, cfg, alpha))
    return scores, len(sources)


def best_score(scores: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The best sacreBLEU; of equal ones, the alpha nearest the paper's."""
    return max(scores, key=lambda s: (s["sacrebleu"], -abs(s["alpha"] - PAPER_LENGTH_PENALTY)))


def search_alphas(alphas: Sequence[float], extend_to: float, score: Callable[[float], Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The scores of every alpha in `alphas`, then, while the best is the largest tried, of one
    more step of the grid's last spacing beyond it, up to extend_to (0: never): a best alpha
    at the edge of the grid says that a larger one may be better still."""
    scores = [score(alpha) for alpha in alphas]
    grid = sorted(alphas)
    step = grid[-1] - grid[-2] if len(grid) > 1 and grid[-1] > grid[-2] else 0.5
    while True:
        largest = max(s["alpha"] for s in scores)
        if best_score(scores)["alpha"] != largest:
            return scores
        following = round(largest + step, 6)
        if not extend_to or following > extend_to + 1e-9:
            if len(scores) > 1:  # a choice at the edge: a larger alpha may score higher still (short output)
                log.warning(f"the chosen alpha, {largest}, is the largest tried (tune.extend_to is {extend_to}): "
                            f"a larger one may score higher; raise tune.extend_to to try it")
            return scores
        log.info(f"the best alpha so far, {largest}, is the largest tried: trying {following}")
        scores.append(score(following))


def _score(translator: Translator, sources: List[str], references: List[str], cfg: TranslateConfig,
           alpha: float) -> Dict[str, Any]:
    """One alpha's decode of the dev sentences, scored; printed as a line."""
    started = time.monotonic()
    hypotheses = translator.translate(sources, dataclasses.replace(cfg.decode, length_penalty=alpha))
    bleu, _ = corpus_bleu(hypotheses, references)
    score = {"alpha": alpha, "sacrebleu": round(bleu.score, 2), "bp": round(bleu.bp, 4),
             "ratio": round(bleu.sys_len / max(bleu.ref_len, 1), 4), "seconds": round(time.monotonic() - started, 1)}
    print(f"alpha {alpha}: sacreBLEU {score['sacrebleu']:.2f}, BP {score['bp']:.3f}, "
          f"length ratio {score['ratio']:.3f} ({score['seconds']} s)", flush=True)
    return score
