"""Validation on the dev split during training: the dev loss, the sacreBLEU of a greedy decode
by the Translator that decode uses, the best metric so far (Tracker: checkpoint_best.pt) and
when to stop (valid.patience, train.target_bleu)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from translate.core.choices import ValidMetric

from translate.core.config import DecodeConfig, TranslateConfig
from translate.data.batching import collate, token_batches
from translate.data.cache import EncodedSplit, PreparedData
from translate.data.loading import load_corpus
from translate.data.vocabulary import SpecialIds, Vocabulary
from translate.metrics import corpus_bleu
from translate.training import distributed
from translate.training.loss import LabelSmoothedObjective
from translate.translator import Translator

Sentences = Tuple[List[str], List[str]]  # dev sources and their references


@torch.no_grad()
def dev_loss(model: nn.Module, split: EncodedSplit, specials: SpecialIds, tokens_per_batch: int, device: torch.device,
             label_smoothing: float) -> Dict[str, float]:
    """Label-smoothed loss and NLL per target token over the whole dev split (eval mode)."""
    was_training = model.training
    model.eval()
    objective = LabelSmoothedObjective(model, label_smoothing)
    loss = nll = tokens = 0.0
    for indices in token_batches(split.src_lengths, split.tgt_lengths, tokens_per_batch, seed=0, epoch=0):
        inputs = collate(split, indices, specials).objective_inputs(device)  # src, tgt_in, select, target, as in train_step
        batch_loss, batch_nll = objective(*inputs)
        loss, nll, tokens = loss + batch_loss.item(), nll + batch_nll.item(), tokens + len(inputs[-1])
    model.train(was_training)
    return {"loss": loss / tokens, "nll": nll / tokens}


def dev_bleu(model: nn.Module, vocabulary: Vocabulary, sources: List[str], references: List[str]) -> Tuple[float, List[str]]:
    """sacreBLEU of greedy translations of the given dev sentences, and the translations."""
    was_training = model.training
    model.eval()
    hypotheses = Translator(model, vocabulary).translate(sources, DecodeConfig(beam_size=1))
    model.train(was_training)
    return corpus_bleu(hypotheses, references)[0].score, hypotheses


class Tracker:
    """The best dev metric so far and validations since it improved (saved in checkpoints)."""

    def __init__(self, metric: ValidMetric):
        self.metric = metric
        self.best: Optional[float] = None
        self.since_best = 0

    def update(self, value: float) -> bool:
        """Record a validation; True if it is the best so far (lower loss, or higher BLEU)."""
        better = self.best is None or (value > self.best if self.metric == ValidMetric.bleu else value < self.best)
        if better:
            self.best, self.since_best = value, 0
        else:
            self.since_best += 1
        return better

    def state_dict(self) -> dict:
        return {"metric": str(self.metric), "best": self.best, "since_best": self.since_best}  # plain values

    def load_state_dict(self, state: dict) -> None:
        if state.get("metric") == self.metric:
            self.best, self.since_best = state["best"], state["since_best"]


@dataclass
class Validation:
    """One validation's outcome."""

    metrics: Dict[str, float]  # loss, nll, and bleu where dev sentences are translated
    hypotheses: List[str]  # the dev translations (none without BLEU)
    improved: bool  # the best valid.metric so far
    reached: bool  # dev BLEU reached train.target_bleu
    stop: Optional[str]  # why training stops here (the target reached, valid.patience), or None


class Validator:
    """The dev metrics of a run's model every valid.every_steps updates (on the main process):
    loss and NLL over the dev split, and with valid.bleu_sentences the sacreBLEU of their greedy
    translation; the best so far; whether to stop."""

    def __init__(self, cfg: TranslateConfig, data: PreparedData, context: distributed.Context):
        self.cfg, self.data, self.context = cfg, data, context
        self.tracker = Tracker(cfg.valid.metric)
        self.dev: Optional[Sentences] = None  # the dev sentences translated for BLEU (load_dev_sentences)

    def load_dev_sentences(self) -> None:
        """The first valid.bleu_sentences (source, reference) pairs of the dev split, read on the
        main process where validations translate them."""
        valid = self.cfg.valid
        if self.context.is_main and valid.every_steps and valid.bleu_sentences:
            sources, references = load_corpus(self.cfg.data, self.cfg.data.valid_split).pairs()
            self.dev = sources[: valid.bleu_sentences], references[: valid.bleu_sentences]

    def due(self, updates: int) -> bool:
        """Whether a validation follows this update (valid.every_steps, where there is a dev split)."""
        every = self.cfg.valid.every_steps
        return bool(every) and updates % every == 0 and self.data.valid is not None

    def run(self, model: nn.Module, updates: int) -> Validation:
        """Validate the model after `updates` updates."""
        cfg = self.cfg
        metrics = dev_loss(model, self.data.valid, self.data.vocabulary.specials, cfg.train.tokens_per_batch,
                           self.context.device, cfg.train.label_smoothing)
        hypotheses: List[str] = []
        if self.dev is not None:
            metrics["bleu"], hypotheses = dev_bleu(model, self.data.vocabulary, *self.dev)
        improved = self.tracker.update(metrics[cfg.valid.metric])
        reached = cfg.train.target_bleu is not None and metrics["bleu"] >= cfg.train.target_bleu
        stop = None
        if reached:
            stop = f"stopping at update {updates}: train.target_bleu reached"
        elif cfg.valid.patience and self.tracker.since_best >= cfg.valid.patience:
            stop = f"early stopping at update {updates}: no better {cfg.valid.metric} in {cfg.valid.patience} validations"
        return Validation(metrics, hypotheses, improved, reached, stop)
