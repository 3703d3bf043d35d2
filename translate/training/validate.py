"""Validation on the dev split during training: loss, and BLEU of a quick greedy decode."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from translate.config import DecodeConfig, TranslateConfig, ValidMetric
from translate.data.batching import collate, token_batches
from translate.data.cache import EncodedSplit
from translate.data.vocabulary import SpecialIds, Vocabulary
from translate.training.loss import LabelSmoothedObjective


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
    from translate.decode import Translator
    from translate.score import corpus_bleu

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


def dev_sentences(cfg: TranslateConfig) -> Tuple[List[str], List[str]]:
    """The first valid.bleu_sentences (source, reference) pairs of the dev split."""
    from translate.data.loading import load_corpus

    sources, references = load_corpus(cfg.data, cfg.data.valid_split).pairs()
    return sources[: cfg.valid.bleu_sentences], references[: cfg.valid.bleu_sentences]


def evaluate(model: nn.Module, valid: EncodedSplit, vocabulary: Vocabulary, dev: Optional[Tuple[List[str], List[str]]],
             tokens_per_batch: int, label_smoothing: float, device: torch.device) -> Tuple[Dict[str, float], List[str]]:
    """The dev metrics (loss, nll, and bleu where `dev` sentences are given) and the dev
    translations (none without `dev`)."""
    metrics = dev_loss(model, valid, vocabulary.specials, tokens_per_batch, device, label_smoothing)
    hypotheses: List[str] = []
    if dev is not None:
        metrics["bleu"], hypotheses = dev_bleu(model, vocabulary, *dev)
    return metrics, hypotheses
