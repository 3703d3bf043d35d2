"""Typed configuration schema: one dataclass per config group.

The dataclasses are the schema and every default: the YAML files in configs/ state only
what differs from them. Hydra validates every composed config against these classes, so an
unknown key, a value of the wrong type or outside an enumeration (the Choice enums of
translate/core/choices.py),
and a broken rule between settings (__post_init__) fail at start-up with one line naming the
key. Nothing here imports Hydra; hydra_cli.py registers the schema.
"""

from __future__ import annotations

import enum
import typing
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Mapping, Optional, Type, TypeVar

from translate.core.choices import (BleuFormat, Decay, ExportFormat, Init, LiteratureBleu, Norm, PlotKind, Positions, Precision, TableFormat,
                               ValidMetric, VocabType)

T = TypeVar("T")


def to_plain(cfg: Any) -> Dict[str, Any]:
    """A config dataclass as nested dicts of plain values (Choice members become their
    strings): what checkpoints keep, so that loading them needs no class of ours."""

    def plain(items):
        return {key: value.value if isinstance(value, enum.Enum) else value for key, value in items}

    return asdict(cfg, dict_factory=plain)


def from_plain(cls: Type[T], values: Mapping[str, Any]) -> T:
    """A config dataclass from plain values, as to_plain (and so checkpoints) keep them: each
    Choice field built from its string; keys the class does not have are left out (older or
    newer files), and fields the values lack take their defaults."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in fields(cls)}
    given = {}
    for key, value in values.items():
        if key in names:
            hint = hints[key]
            given[key] = hint(value) if isinstance(hint, type) and issubclass(hint, enum.Enum) else value
    return cls(**given)


@dataclass
class ModelConfig:
    """Transformer size (paper, Table 3). Travels inside every checkpoint."""

    d_model: int = 512  # width of every sub-layer output and embedding
    d_ff: int = 2048  # inner width of the position-wise feed-forward network
    heads: int = 8  # attention heads (h)
    layers: int = 6  # encoder layers and decoder layers (N)
    dropout: float = 0.1  # P_drop: sub-layer outputs and embedding sums
    d_k: Optional[int] = None  # query and key width per head (Table 3, row B); None: d_model / heads
    d_v: Optional[int] = None  # value width per head; None: d_model / heads
    positions: Positions = Positions.sinusoidal  # sinusoidal (the paper) or learned (Table 3, row E)
    norm: Norm = Norm.post  # post (the paper) or pre (LayerNorm before each sub-layer)
    # Learned positions: rows of the table, set at training time to what decode serves
    # (decode.max_source_length and its output cap); 0 for sinusoidal ones, which serve any.
    max_positions: int = 0
    vocab_size: int = 0  # set from the sentencepiece model at training time
    # The shared embedding gets rows up to a multiple of this (never looked up or predicted):
    # the vocabulary projection's output width then suits tensor cores. 1: no padding.
    vocab_multiple: int = 8

    def __post_init__(self) -> None:
        if (self.d_k is None or self.d_v is None) and self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads}), or set model.d_k "
                             "and model.d_v")
        if self.vocab_multiple < 1:
            raise ValueError(f"vocab_multiple ({self.vocab_multiple}) must be at least 1")

    @property
    def key_width(self) -> int:
        """d_k: query and key width of one head."""
        return self.d_k or self.d_model // self.heads

    @property
    def value_width(self) -> int:
        """d_v: value width of one head."""
        return self.d_v or self.d_model // self.heads

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding matrix: vocab_size rounded up to a multiple of vocab_multiple."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple


@dataclass
class DataConfig:
    """Where the parallel corpus comes from and how it is tokenized."""

    path: Optional[str] = None  # hub id (wmt/wmt14) or local folder of the same layout
    name: Optional[str] = None  # hub config, e.g. de-en
    src_lang: str = "en"  # source language code (column or file suffix)
    tgt_lang: str = "de"  # target language code
    vocab_size: int = 37000  # joint sentencepiece vocabulary size (tokens)
    vocab_type: VocabType = VocabType.bpe  # sentencepiece model_type: bpe or unigram
    vocab_sample: int = 2_000_000  # at most this many sentences (a seeded random sample) train the vocabulary
    spm_model: Optional[str] = None  # an existing sentencepiece model to use instead (wins over vocab_size)
    train: Optional[str] = None  # plain text: file prefix, reads PREFIX.<src_lang>, PREFIX.<tgt_lang>
    valid: Optional[str] = None  # plain text: dev set prefix
    test: Optional[str] = None  # plain text: test set prefix
    train_split: str = "train"  # dataset split used for training
    valid_split: str = "validation"  # dataset split used for validation (dev set)
    lowercase: bool = False  # every split lowercased (both sides) before the vocabulary, as the Multi30k literature trains; the checkpoint lowercases what it translates
    max_length: int = 250  # training pairs with a longer side (in tokens) are dropped
    max_length_ratio: float = 0.0  # training pairs whose longer side exceeds this many times the shorter are dropped; 0 keeps all
    cache_dir: str = "cache"  # encoded corpora and vocabularies, keyed by fingerprint
    literature_bleu: LiteratureBleu = LiteratureBleu.tokenized  # the tokenized BLEU this data set's papers report
    # BPE-dropout (Provilkov et al., 2020): when the training split is segmented, each merge is
    # skipped with this probability, so a word comes in several segmentations and the model learns
    # its pieces from each; dev, test and decoding keep the one deterministic segmentation. 0: off.
    bpe_dropout: float = 0.0
    # Sampled segmentations of the training split kept in the token cache; epoch e trains on number
    # e mod this (one per epoch would cost the cache a copy of the split per epoch).
    bpe_dropout_copies: int = 16

    def __post_init__(self) -> None:
        if not 0 <= self.bpe_dropout < 1:
            raise ValueError(f"data.bpe_dropout ({self.bpe_dropout}) must be in [0, 1)")
        if self.bpe_dropout_copies < 1:
            raise ValueError(f"data.bpe_dropout_copies ({self.bpe_dropout_copies}) must be at least 1")
        if self.bpe_dropout and self.vocab_type == VocabType.unigram and not self.spm_model:
            # sentencepiece's sampling of a unigram model is another rule (Kudo, 2018), with alpha a smoothing
            raise ValueError("data.bpe_dropout needs data.vocab_type=bpe")


@dataclass
class OptimConfig:
    """Adam with the paper's learning-rate schedule (section 5.3)."""

    betas: List[float] = field(default_factory=lambda: [0.9, 0.98])  # Adam beta1, beta2
    eps: float = 1e-9  # Adam epsilon
    warmup_steps: int = 4000  # linear warmup to the peak lr_scale * d_model^-0.5 * warmup^-0.5 (updates)
    lr_scale: float = 1.0  # multiplier on d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    # After the warmup: the paper's step^-0.5, or linear to zero at train.max_steps, or under
    # train.max_minutes at the update the time limit is projected (at the warmup's end) to reach.
    decay: Decay = Decay.inverse_sqrt
    # At most this share of the run's updates warms up (train.max_steps, or the update train.max_minutes
    # is projected to reach from the first 50 updates' pace): a run too short for warmup_steps (a slow
    # CPU's hour) stops on the same ramp at that share, at a lower peak, and decays from there. None: off.
    warmup_ratio: Optional[float] = None
    # The peak of a warmup cut by warmup_ratio to w updates: the full peak * (w / warmup_steps)^power,
    # up a ramp steeper than the paper's. 1: the rate the ramp reached there; 0: the full peak (which
    # diverged after a quarter of the warmup); 0.5: the ramp a slow CPU's hour was fitted with on dev.
    cut_peak_power: float = 1.0
    clip_norm: float = 0.0  # gradient norm clipping; 0 disables (the paper does not clip)

    def __post_init__(self) -> None:
        if self.warmup_ratio is not None and not 0 < self.warmup_ratio <= 1:
            raise ValueError(f"optim.warmup_ratio ({self.warmup_ratio}) must be in (0, 1], or null")
        if not 0 <= self.cut_peak_power <= 1:
            raise ValueError(f"optim.cut_peak_power ({self.cut_peak_power}) must be in [0, 1]")
        if self.cut_peak_power != 1 and self.warmup_ratio is None:
            raise ValueError(f"optim.cut_peak_power ({self.cut_peak_power}) applies to a warmup cut by optim.warmup_ratio, which is null")


@dataclass
class TrainConfig:
    """The training loop."""

    label_smoothing: float = 0.1  # eps_ls of the label-smoothed cross-entropy
    # R-Drop's alpha (Liang et al. 2021): each batch runs through the model twice, with different
    # dropout masks, and alpha weighs the symmetric KL divergence between the two predictions
    # against their cross-entropy (as the paper's). An update then costs two. 0: off.
    rdrop: float = 0.0
    tokens_per_batch: int = 25000  # per process: padded source (and target) tokens per micro-batch, at most tokens_per_update / processes
    tokens_per_update: int = 25000  # per optimizer update over all processes and accumulation
    max_steps: int = 100000  # stop after this many updates
    max_minutes: Optional[float] = None  # stop after this much wall time (minutes)
    seed: int = 1  # seeds weights, dropout and batch order
    log_every: int = 10  # updates between TensorBoard/log lines
    threads: Optional[int] = None  # torch CPU threads; None keeps torch's default
    precision: Precision = Precision.auto  # fp32, bf16 or fp16 (with loss scaling); auto: bf16 on GPUs and on CPUs with native bf16 (AMX, AVX512-BF16, unless ONEDNN_MAX_CPU_ISA caps oneDNN below them), else fp32
    compile: bool = False  # torch.compile the model: for long GPU runs (its compile time does not pay back on small CPUs)
    init_from: Optional[str] = None  # start from this checkpoint's weights (fresh optimizer and schedule)
    # How a fresh run's weights start: xavier (tensor2tensor's) or fairseq (fairseq 0.12.2's)
    init: Init = Init.xavier
    max_nonfinite: int = 10  # this many non-finite updates in a row (each skipped) stop the run
    # Seconds a process of a distributed job may go silent (died, stopped, its node frozen)
    # before every other one names it and exits (training/watchdog.py); 0: wait on it forever.
    stall_timeout: float = 300.0
    # Stop at the first validation whose dev BLEU reaches this (MLPerf's quality target); the run
    # record keeps the time to it (seconds, updates, tokens, FLOPs). None: no target.
    target_bleu: Optional[float] = None


@dataclass
class CheckpointConfig:
    """When checkpoints are written and which are kept (paper: every 10 minutes, average the last 5 or 20)."""

    every_steps: int = 1000  # updates between numbered checkpoints (one is always written at the end)
    every_minutes: Optional[float] = 10.0  # also write one after this much wall time (minutes); null disables
    # Also write one at the end of every N-th epoch (a pass over the training data), as fairseq
    # does; with every_steps=0 and no every_minutes the numbered checkpoints are the epochs'
    # alone (the end of a run then writes checkpoint_last.pt only): averaging takes the last N epochs.
    every_epochs: int = 0
    keep_last: int = 5  # numbered checkpoints kept (older ones are deleted); checkpoint_last.pt always stays
    average_last: int = 0  # decode uses the average of the last N numbered checkpoints; 0 uses the last one
    # Write checkpoints in a thread from a copy in memory, so that training does not wait for the
    # disk (seconds at big size; training slows meanwhile on a CPU, whose cores the write shares:
    # docs/reliability.md); the files are the same, renamed into place once whole. It holds a
    # copy of the state (weights and Adam's moments) while writing. false: training waits.
    background: bool = True

    @property
    def by_epochs_alone(self) -> bool:
        """Whether the numbered checkpoints are written at the ends of epochs only."""
        return self.every_epochs > 0 and self.every_steps == 0 and self.every_minutes is None


@dataclass
class ValidConfig:
    """Validation on the dev split (newstest2013 for WMT14) during training."""

    every_steps: int = 1000  # updates between validations; 0 disables
    metric: ValidMetric = ValidMetric.loss  # loss or bleu: which one chooses checkpoint_best.pt (and early stopping)
    bleu_sentences: int = 0  # dev sentences translated (greedy) for BLEU at each validation; 0: no BLEU
    patience: int = 0  # stop after this many validations without improvement; 0: never

    def __post_init__(self) -> None:
        if self.metric == ValidMetric.bleu and self.bleu_sentences < 1:
            raise ValueError("valid.metric=bleu needs valid.bleu_sentences > 0 (dev sentences to translate)")


PAPER_LENGTH_PENALTY = 0.6  # section 6.1's alpha

# Settings added after runs were recorded, at the value that trains as the code did before them: a
# run record (translate table) or a frozen preset's snapshot (tests/test_frozen_presets.py) that
# lacks one trained at that value.
ADDED_LATER: Dict[str, Any] = {"train.rdrop": 0.0, "optim.warmup_ratio": None, "optim.cut_peak_power": 1.0,
                               "data.bpe_dropout": 0.0, "data.bpe_dropout_copies": 16}


@dataclass
class DecodeConfig:
    """Beam search (section 6.1) on a dataset split or a text file: every setting of a search,
    which the decoder and both exports take as it is."""

    split: str = "test"  # dataset split to translate (newstest2014 for WMT14)
    input: Optional[str] = None  # a file of source sentences instead of a split (- : stdin to stdout)
    output: Optional[str] = None  # where translations go; default <run_dir>/decode/<split or input name>.<tgt_lang>
    checkpoint: Optional[str] = None  # default <run_dir>/checkpoint_average.pt with checkpoint.average_last, else checkpoint_last.pt
    beam_size: int = 4  # hypotheses kept per sentence; 1 is greedy search
    # alpha of the GNMT penalty ((5 + |Y|) / 6) ** alpha. On the command line the default is the
    # run's choice on the dev split (`translate tune`, configs/common.yaml), else the paper's 0.6.
    length_penalty: float = PAPER_LENGTH_PENALTY
    max_len_a: float = 1.0  # maximum output length = max_len_a * source length + max_len_b (output_cap)
    max_len_b: int = 50
    # Source tokens kept of an input line (sentencepiece pieces, before EOS): longer lines are
    # cut to it, with a warning naming them; every decoder and the exports' position tables
    # serve this much (and its output cap).
    max_source_length: int = 1024
    tokens_per_batch: int = 16000  # padded source tokens times beam size per decoding batch
    nbest: int = 1  # hypotheses written per sentence (index, score, text; tab-separated when > 1)
    sampling: bool = False  # sample instead of searching (temperature, top_k, top_p apply)
    temperature: float = 1.0  # divides the logits before sampling
    top_k: int = 0  # sample among the k most probable tokens; 0 keeps all
    top_p: float = 1.0  # sample within the smallest set of tokens whose probability reaches p
    seed: int = 1  # seeds sampling
    # fp32, or bf16 (autocast: products in bf16, softmax and normalization in fp32), worth it on
    # CPUs with native bf16 (AMX, AVX512-BF16) and on GPUs; auto: bf16 where the device has it.
    precision: Precision = Precision.fp32

    def __post_init__(self) -> None:
        if self.precision == Precision.fp16:
            raise ValueError("decode.precision=fp16: decoding runs in fp32 or bf16 (or auto)")
        if self.beam_size < 1 or self.nbest < 1 or self.nbest > self.beam_size:
            raise ValueError(f"decode.nbest ({self.nbest}) must be between 1 and decode.beam_size ({self.beam_size})")
        if self.sampling and self.temperature <= 0:
            raise ValueError(f"decode.temperature ({self.temperature}) must be positive")
        if self.max_source_length < 1:
            raise ValueError(f"decode.max_source_length ({self.max_source_length}) must be at least 1")

    def output_cap(self, source_length: int) -> int:
        """Output tokens allowed (EOS aside) for a source of this many tokens (EOS aside):
        max_len_a * source_length + max_len_b (the paper: input length + 50). The one place
        the cap is computed; output_limit adds the EOS that ends an output."""
        return int(self.max_len_a * source_length + self.max_len_b)

    def output_limit(self, source_length: int) -> int:
        """Tokens a search may generate for a source of this many tokens (EOS aside): the cap
        and the EOS that ends the output (which a search forces there)."""
        return self.output_cap(source_length) + 1

    def positions(self) -> int:
        """Positions a model must serve: max_source_length source tokens and EOS, or BOS and
        the longest output with its EOS."""
        return max(self.max_source_length + 1, 1 + self.output_limit(self.max_source_length))


@dataclass
class TuneConfig:
    """The length penalty chosen on the dev split (`translate tune`), as the paper chose alpha
    and the beam size "after experimentation on the development set" (section 6.1)."""

    alphas: List[float] = field(default_factory=lambda: [0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.5])  # tried, each a decode of the dev split
    sentences: int = 0  # dev sentences decoded (the first ones); 0: all of data.valid_split
    # While the best alpha is the largest tried, one more step of the grid's last spacing is
    # tried beyond it, up to this alpha (0: the grid only).
    extend_to: float = 3.0

    def __post_init__(self) -> None:
        if not self.alphas or self.sentences < 0 or self.extend_to < 0:
            raise ValueError(f"tune.alphas ({self.alphas}) needs a value, tune.sentences ({self.sentences}) and "
                             f"tune.extend_to ({self.extend_to}) must not be negative")


@dataclass
class BleuConfig:
    """Scoring: sacreBLEU, chrF and the paper's tokenized BLEU."""

    hyp: Optional[str] = None  # translations; default: decode's output
    ref: Optional[str] = None  # references; default: the reference decode wrote beside it
    baseline: Optional[str] = None  # a second system's translations: paired bootstrap test against hyp
    bootstrap_samples: int = 1000  # resamples of the paired bootstrap test
    format: BleuFormat = BleuFormat.text  # text (readable lines) or json (one object with every score)

    def __post_init__(self) -> None:
        if self.bootstrap_samples < 1:
            raise ValueError(f"bleu.bootstrap_samples={self.bootstrap_samples}: must be at least 1")


@dataclass
class ExportConfig:
    """Conversion of a checkpoint to a production inference engine."""

    format: ExportFormat = ExportFormat.ctranslate2  # ctranslate2 or transformers
    output: Optional[str] = None  # folder to write; default <run_dir>/export/<format>
    checkpoint: Optional[str] = None  # default: the checkpoint decode would use


@dataclass
class TableConfig:
    """Runs side by side (`translate table`), as the paper's Table 3."""

    runs: List[str] = field(default_factory=list)  # run_dirs; a multirun's folder stands for its jobs
    format: TableFormat = TableFormat.markdown  # markdown, or json (one list of rows)


@dataclass
class PlotConfig:
    """Figures (`translate plot`): one sentence's attention, as the paper's Figures 3-5, or the
    curves of runs."""

    kind: PlotKind = PlotKind.attention  # attention (one sentence through a checkpoint) or curves (of runs)
    sentence: Optional[str] = None  # the source sentence; None: line plot.line of plot.input, else the paper's Figure 3 one
    input: Optional[str] = None  # a file of source sentences, one a line (instead of plot.sentence)
    line: int = 1  # the line of plot.input drawn, counted from 1
    layer: int = 0  # the encoder and decoder layer drawn, counted from 1 (Figure 3: layer 5 of 6); 0: the last
    checkpoint: Optional[str] = None  # default: the checkpoint decode would use
    output: Optional[str] = None  # the PNG; default <run_dir>/plots/<kind>.png; what it draws is written beside it
    width: int = 1600  # pixels
    height: int = 1200  # pixels
    dpi: int = 100  # pixels per inch: the scale of the text (the figure is width / dpi by height / dpi inches)
    runs: List[str] = field(default_factory=list)  # curves: run_dirs, as table.runs; none: run_dir

    def __post_init__(self) -> None:
        if self.sentence is not None and self.input is not None:
            raise ValueError("plot.sentence and plot.input both given: draw one sentence")
        if self.line < 1 or self.layer < 0:
            raise ValueError(f"plot.line ({self.line}) counts from 1, plot.layer ({self.layer}) from 1 (0: the last)")
        if min(self.width, self.height, self.dpi) < 1:
            raise ValueError(f"plot.width, plot.height and plot.dpi must be positive ({self.width}, {self.height}, {self.dpi})")


@dataclass
class TranslateConfig:
    """The whole tree, shared by every verb so that they agree on run_dir."""

    run_dir: str = "runs/default"  # checkpoints, logs and decodes of one experiment
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Above: what training reads (decode reads model and data too). Below: validation's
    decoding and the other verbs' sections."""
    valid: ValidConfig = field(default_factory=ValidConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    bleu: BleuConfig = field(default_factory=BleuConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    table: TableConfig = field(default_factory=TableConfig)
    plot: PlotConfig = field(default_factory=PlotConfig)

    def __post_init__(self) -> None:
        if self.train.target_bleu is not None and (self.valid.every_steps < 1 or self.valid.bleu_sentences < 1):
            raise ValueError("train.target_bleu needs validations with BLEU: valid.every_steps > 0 and "
                             "valid.bleu_sentences > 0")
