"""Validation on the dev split during training: loss, and BLEU of a quick greedy decode."""

from __future__ import annotations

import logging

from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from translate import checkpoint, distributed, paths
from translate.config import TranslateConfig
from translate.data.batching import collate, token_batches
from translate.data.cache import EncodedSplit
from translate.data.vocabulary import Vocabulary
from translate.errors import TranslateError
from translate.loss import LabelSmoothedObjective

log = logging.getLogger("translate.train")


@torch.no_grad()
def dev_loss(model: nn.Module, split: EncodedSplit, tokens_per_batch: int, device: torch.device,
             label_smoothing: float) -> Dict[str, float]:
    """Label-smoothed loss and NLL per target token over the whole dev split (eval mode)."""
    was_training = model.training
    model.eval()
    objective = LabelSmoothedObjective(model, label_smoothing)
    loss = nll = tokens = 0.0
    for indices in token_batches(split.src_lengths, split.tgt_lengths, tokens_per_batch, seed=0, epoch=0):
        inputs = collate(split, indices).objective_inputs(device)  # src, tgt_in, select, target, as in train_step
        batch_loss, batch_nll = objective(*inputs)
        loss, nll, tokens = loss + batch_loss.item(), nll + batch_nll.item(), tokens + len(inputs[-1])
    model.train(was_training)
    return {"loss": loss / tokens, "nll": nll / tokens}


def dev_bleu(model: nn.Module, vocabulary: Vocabulary, sources: List[str], references: List[str]) -> Tuple[float, List[str]]:
    """sacreBLEU of greedy translations of the given dev sentences, and the translations."""
    from translate.decode import Translator
    from translate.score import corpus_bleu

    was_training = model.training
    model.eval()
    hypotheses = Translator(model, vocabulary).translate(sources, beam_size=1)
    model.train(was_training)
    return corpus_bleu(hypotheses, references)[0].score, hypotheses


class Tracker:
    """The best dev metric so far and validations since it improved (saved in checkpoints)."""

    def __init__(self, metric: str):
        self.metric = metric
        self.best: Optional[float] = None
        self.since_best = 0

    def update(self, value: float) -> bool:
        """Record a validation; True if it is the best so far (lower loss, or higher BLEU)."""
        better = self.best is None or (value > self.best if self.metric == "bleu" else value < self.best)
        if better:
            self.best, self.since_best = value, 0
        else:
            self.since_best += 1
        return better

    def state_dict(self) -> dict:
        return {"metric": self.metric, "best": self.best, "since_best": self.since_best}

    def load_state_dict(self, state: dict) -> None:
        if state.get("metric") == self.metric:
            self.best, self.since_best = state["best"], state["since_best"]


def dev_sentences(cfg: TranslateConfig):
    from translate.data.loading import load_corpus

    sources, references = load_corpus(cfg.data, cfg.data.valid_split).pairs()
    return sources[: cfg.valid.bleu_sentences], references[: cfg.valid.bleu_sentences]


def validate(cfg, context, model, data, vocabulary, tracker: Tracker, dev, writer, step: int, run_dir: Path) -> bool:
    """Validate on rank 0, keep checkpoint_best.pt; returns whether to stop early (agreed by all)."""
    stop = False
    if context.is_main:
        metrics = dev_loss(model, data.valid, cfg.train.tokens_per_batch, context.device, cfg.train.label_smoothing)
        if dev is not None:
            metrics["bleu"], hypotheses = dev_bleu(model, vocabulary, *dev)
            writer.add_text("dev/translations", "\n\n".join(
                f"{s}  \n→ {h}  \n(ref) {r}" for s, h, r in list(zip(dev[0], hypotheses, dev[1]))[:5]), step)
        for name, value in metrics.items():
            writer.add_scalar(f"dev/{name}", value, step)
        if cfg.valid.metric not in metrics:
            raise TranslateError(f"valid.metric={cfg.valid.metric} needs valid.bleu_sentences > 0" if cfg.valid.metric == "bleu"
                                 else f"valid.metric={cfg.valid.metric!r}: choose loss or bleu")
        improved = tracker.update(metrics[cfg.valid.metric])
        text = " ".join(f"{k} {v:.3f}" for k, v in metrics.items())
        log.info(f"update {step}: dev {text}" + (" (best)" if improved else f" (best {tracker.best:.3f})"))
        if improved:
            languages = [cfg.data.src_lang, cfg.data.tgt_lang]
            payload = checkpoint.weights(model, model.cfg, vocabulary.model_bytes, languages, step)
            checkpoint.save(run_dir / paths.BEST_CHECKPOINT, {**payload, "dev": metrics})
        stop = bool(cfg.valid.patience) and tracker.since_best >= cfg.valid.patience
    return distributed.any_true(stop, context)
