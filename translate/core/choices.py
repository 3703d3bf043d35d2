"""The settings that take one of a fixed set of values (Choice): OmegaConf refuses any other,
naming the allowed ones, and checkpoints keep them as plain strings (config.from_plain builds
them again)."""

from __future__ import annotations

import enum


class Choice(str, enum.Enum):
    """A setting with a fixed set of lowercase values: OmegaConf refuses any other, naming
    the allowed ones. Equal to its value as a string, and printed as it."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class VocabType(Choice):
    """sentencepiece's model_type for the joint vocabulary."""

    bpe = "bpe"  # byte-pair encoding (the paper's EN-DE)
    unigram = "unigram"  # unigram language model (word pieces, as the paper's EN-FR)


class Positions(Choice):
    """How the model knows where a token is (section 3.5; Table 3, row E)."""

    sinusoidal = "sinusoidal"  # the paper's fixed sines and cosines: any length
    learned = "learned"  # a learned embedding per position, up to model.max_positions


class Init(Choice):
    """How the weights start (the paper does not say)."""

    # tensor2tensor's, the paper's code: Xavier-uniform projections (Q, K and V each its own
    # matrix), zero biases, embeddings N(0, d_model^-0.5)
    xavier = "xavier"
    # fairseq 0.12.2's: as xavier, but Q, K and V with gain 1/sqrt(2) and torch's default biases,
    # the feed-forward layers torch's default nn.Linear init, the padding embedding zero
    fairseq = "fairseq"


class Norm(Choice):
    """Where each sub-layer's LayerNorm sits."""

    post = "post"  # the paper's LayerNorm(x + Sublayer(x))
    pre = "pre"  # x + Sublayer(LayerNorm(x)), and a final LayerNorm per stack (Xiong et al. 2020)


class Decay(Choice):
    """How the learning rate falls after its warmup."""

    inverse_sqrt = "inverse_sqrt"  # the paper's n^-0.5 (section 5.3): for runs of no set length
    linear = "linear"  # to zero just past train.max_steps (fairseq's polynomial_decay, power 1): for a budget of updates


class Precision(Choice):
    auto = "auto"  # bf16 on GPUs and on CPUs with native bf16 (AMX, AVX512-BF16), fp32 on other CPUs
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"  # with loss scaling


class LiteratureBleu(Choice):
    """Which tokenized BLEU a data set's literature reports (translate bleu shows both)."""

    tokenized = "tokenized"  # the paper's (WMT14): Moses-tokenized, German compounds split, cased
    lowercased = "lowercased"  # Multi30k's (e.g. Wu et al. 2021): lowercased, then Moses-tokenized


class ValidMetric(Choice):
    loss = "loss"  # lower is better
    bleu = "bleu"  # higher is better; needs valid.bleu_sentences


class BleuFormat(Choice):
    text = "text"
    json = "json"


class TableFormat(Choice):
    markdown = "markdown"
    json = "json"


class ExportFormat(Choice):
    ctranslate2 = "ctranslate2"  # a CTranslate2 model folder
    transformers = "transformers"  # a Hugging Face transformers folder (MarianMTModel, MarianTokenizer, model card)


class PlotKind(Choice):
    attention = "attention"  # one sentence's attention through a checkpoint (the paper's Figures 3-5)
    curves = "curves"  # training loss, dev perplexity and dev BLEU of runs, against updates and minutes
