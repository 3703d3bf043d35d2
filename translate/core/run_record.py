"""The run record: one JSON file in run_dir that says what a run is and what it has done.

train keeps it current (settings, languages, data, model size, updates, training compute summed
across resumes, the last validation's metrics, the commands run); bleu adds each scored report
with its signatures, when it scored, and what decode translated (Decoded, which decode writes
beside its output: the weights, the search, the code and the machine), every scoring of a test
split kept; tune the length penalty it chose on the dev split. The transformers
export's model card is written from it.

RunRecord and its parts name every key; load and save read and write the plain JSON, which
tune's entries still go through.
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional

from translate.core import paths
from translate.core.config import ModelConfig, from_plain
from translate.core.errors import TranslateError
from translate.core.json_fields import FieldError, JsonObject

LENGTH_PENALTY = "length_penalty"  # tune's last entry: the alpha chosen on the dev split and the scores behind it
LENGTH_PENALTIES = "length_penalties"  # every checkpoint's last entry, by checkpoint_key: each keeps its own alpha


@dataclass(kw_only=True)
class TrainTokens(JsonObject):
    source: int
    target: int


@dataclass(kw_only=True)
class VocabularyFacts(JsonObject):
    size: int
    given: Optional[str]  # data.spm_model, where the vocabulary was given rather than trained
    specials: Dict[str, int]  # the ids of pad, unk, bos, eos (Specials.as_dict)


@dataclass(kw_only=True)
class DataFacts(JsonObject):
    """The training data: where from, and what cleaning kept of it."""

    source: Optional[str]  # data.path or data.train
    name: Optional[str]
    languages: List[str]  # [source, target]
    train_pairs: int
    train_pairs_kept: int
    train_tokens: TrainTokens
    vocabulary: VocabularyFacts
    epoch_tokens: Optional[TrainTokens] = None  # an epoch's under data.bpe_dropout (its copies' mean); absent when off


@dataclass(kw_only=True)
class ModelFacts(JsonObject):
    """The model's parameter count beside its settings (ModelConfig, as plain values)."""

    REST = "config"
    parameters: int
    config: Dict[str, Any] = field(default_factory=dict)

    def model_config(self) -> ModelConfig:
        return from_plain(ModelConfig, self.config)


@dataclass
class Compute:
    """Training seconds, model FLOPs and target tokens, summed over the runs of a run_dir."""

    seconds: float = 0.0
    model_flops: float = 0.0
    target_tokens: float = 0.0


@dataclass(kw_only=True)
class TrainingTotals(JsonObject):
    """Where training stands at the last checkpoint, its compute summed over resumes."""

    updates: int
    seconds: float
    model_flops: float
    target_tokens: Optional[int] = None  # None: not counted
    skipped_updates: int
    device: str
    processes: int
    precision: str

    def compute(self) -> Compute:
        return Compute(float(self.seconds), float(self.model_flops), float(self.target_tokens or 0.0))


@dataclass(kw_only=True)
class Validation(JsonObject):
    """The last validation: its update and dev metrics (loss, nll, and bleu where it translated)."""

    REST = "metrics"
    update: int
    metrics: Dict[str, float] = field(default_factory=dict)

    @property
    def loss(self) -> Optional[float]:
        return self.metrics.get("loss")

    @property
    def perplexity(self) -> Optional[float]:
        return math.exp(self.metrics["nll"]) if "nll" in self.metrics else None

    @property
    def bleu(self) -> Optional[float]:
        return self.metrics.get("bleu")


@dataclass(kw_only=True)
class Target(JsonObject):
    """train.target_bleu reached: when (MLPerf's time, from the process start) and at what cost."""

    target_bleu: float
    bleu: float
    update: int
    process_seconds: float
    training_seconds: float
    target_tokens: float
    model_flops: float


@dataclass(kw_only=True)
class Weights(JsonObject):
    """Which weights were decoded (checkpoint.Identity): their update, the checkpoints an average
    is the mean of, and a hash of sampled values."""

    update: int
    averaged: List[str]
    fingerprint: str


@dataclass(kw_only=True)
class Machine(JsonObject):
    """Where a decode ran: the CPU as lscpu names it, the instructions torch dispatched to
    (AVX512, AVX2, DEFAULT), and whether the CPU computes bf16 products natively."""

    cpu: str
    isa: str
    native_bf16: bool
    device: str  # what the model ran on: cpu, or the GPU's name

    @classmethod
    def here(cls, device: str = "cpu") -> "Machine":
        from translate.core.precision import cpu_model, isa, native_bf16  # torch: only where a decode records

        return cls(cpu=cpu_model(), isa=isa(), native_bf16=native_bf16(), device=device)


@dataclass(kw_only=True)
class Decoded(JsonObject):
    """What translate decode translated into one file, kept beside it (<output>.decoded.json) so
    that bleu records which weights and which search a score is of. output_hash tells whether the
    file is still the one decode wrote."""

    checkpoint: str  # as the command named it
    weights: Weights
    split: Optional[str]  # the dataset split translated; None where decode.input was a file
    beam_size: int
    length_penalty: float
    length_penalty_origin: str  # the command line, translate tune's choice, or the configuration
    sampling: bool
    decode_precision: str  # bf16 or fp32, as the search ran
    commit: str  # the code: git describe of the checkout, else the package's version
    machine: Machine
    decoded_at: str  # UTC, ISO 8601
    output_hash: str

    @staticmethod
    def beside(output: Path) -> Path:
        return Path(output).with_name(Path(output).name + DECODED_SUFFIX)

    def write(self, output: Path) -> None:
        with paths.atomic_write(self.beside(output)) as file:
            file.write(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n")

    @classmethod
    def read(cls, output: Path) -> Optional["Decoded"]:
        """What decode wrote beside `output`, where it describes the file as it is now; else None."""
        try:
            decoded = cls.from_json(json.loads(cls.beside(output).read_text(encoding="utf-8")))
        except (OSError, ValueError):  # none, or not decode's (FieldError is a ValueError)
            return None
        return decoded if decoded.output_hash == file_hash(output) else None


DECODED_SUFFIX = ".decoded.json"


def file_hash(path: Path) -> str:
    return hashlib.blake2b(Path(path).read_bytes(), digest_size=16).hexdigest()


def code_version() -> str:
    """The code that ran: `git describe --always --dirty` of the checkout, else the package's version."""
    try:
        found = subprocess.run(["git", "describe", "--always", "--dirty", "--tags"], cwd=paths.PROJECT_ROOT,
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        found = None
    if found is not None and found.returncode == 0 and found.stdout.strip():
        return found.stdout.strip()
    from translate import __version__

    return f"translate {__version__}"


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(kw_only=True)
class Score(JsonObject):
    """One scoring of a file of the run_dir (bleu's report: each metric's value, text and
    signature), with when it was scored, which split it is of and what decode translated it with.
    Scorings of a held-out split are each kept: how often a test split was scored is on the record."""

    hyp: str  # relative to run_dir
    lines: int
    variant: str
    scores: Dict[str, Any]
    text: str
    scored_at: Optional[str] = None  # UTC, ISO 8601; None: recorded before scorings were dated
    split: Optional[str] = None  # the split decoded (None: a file, or not known)
    held_out: Optional[bool] = None  # not the dev split: a test split, each scoring kept
    literature: Optional[str] = None  # the score the data set's papers report (a key of scores)
    decoded: Optional[Decoded] = None  # None: no record of decode's beside the file, or the file changed since

    @property
    def sacrebleu(self) -> Optional[float]:
        return self.scores.get("sacrebleu", {}).get("value")


@dataclass(kw_only=True)
class Restart(JsonObject):
    """One of torchrun's restarts of the job (--max-restarts): when, which attempt, the update it
    resumed from, and why the attempt before it ended, where that one's processes said."""

    attempt: int  # TORCHELASTIC_RESTART_COUNT: 1 for the first restart
    at: str  # UTC, ISO 8601
    resumed_from: int  # the update of the checkpoint it resumed (0: none yet)
    cause: Optional[str] = None


@dataclass(kw_only=True)
class RunRecord(JsonObject):
    """The whole record; a part the run has not written yet is None. Keys it does not name
    (tune's entries) are kept in `others` as they are."""

    REST = "others"
    settings: Optional[Dict[str, Any]] = None  # the run's TranslateConfig, as plain values
    data: Optional[DataFacts] = None
    model: Optional[ModelFacts] = None
    training: Optional[TrainingTotals] = None
    commands: Optional[List[str]] = None  # the train commands that led to the last checkpoint
    valid: Optional[Validation] = None
    target: Optional[Target] = None
    scores: Optional[List[Score]] = None
    restarts: Optional[List[Restart]] = None
    others: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, run_dir: Path) -> "RunRecord":
        """run_dir's record; empty where there is none (or it is not JSON); a record whose parts
        do not fit is one line naming the first that does not."""
        try:
            return cls.from_json(load(run_dir))
        except FieldError as error:
            raise TranslateError(f"{paths.run_record(run_dir)} cannot be read: {error}") from None

    def save(self, run_dir: Path) -> None:
        save(run_dir, self.to_json())

    def setting(self, section: str, name: str, default: Any = None) -> Any:
        """One setting the run trained with (`section.name`), or `default` where it has none."""
        return (self.settings or {}).get(section, {}).get(name, default)

    def test_bleu(self) -> Optional[float]:
        """The sacreBLEU of the run's last scored decode of its test split (decode's default
        output, decode/<decode.split>.<tgt_lang>); other files scored in its run_dir (a sweep's
        dev decodes, say) are not its test score."""
        found = self.test_scorings()
        return found[-1].sacrebleu if found else None

    def test_scorings(self) -> List[Score]:
        """Every scoring of decode's default output of the run's test split (decode.split), oldest
        first: more than one is a test split scored more than once."""
        split = self.setting("decode", "split", "test")
        test = str(paths.decoded(split, self.setting("data", "tgt_lang", "de")))
        return [score for score in self.scores or [] if score.hyp == test or score.held_out and score.split == split]


def load(run_dir: Path) -> Dict[str, Any]:
    """The record of run_dir as plain JSON; empty where there is none (or it cannot be read)."""
    try:
        return json.loads(paths.run_record(run_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def save(run_dir: Path, record: Dict[str, Any]) -> None:
    """Write atomically: readers see the old record or the new one."""
    with paths.atomic_write(paths.run_record(run_dir)) as file:
        file.write(json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def record_training(run_dir: Path, described: RunRecord, *, training: TrainingTotals, valid: Optional[Validation],
                    target: Optional[Target] = None) -> None:
    """train's part, rewritten at every checkpoint: `described`, the run's settings, data and
    model and the train command that wrote it (kept beside those of earlier runs); `training`,
    the updates and the compute totals over every run that led to this checkpoint; `target`,
    when train.target_bleu was reached, the time and compute to it."""
    record = RunRecord.load(run_dir)
    commands = list(record.commands or [])
    commands += [command for command in described.commands or [] if command not in commands]
    record.settings, record.data, record.model = described.settings, described.data, described.model
    record.training, record.commands = training, commands
    if valid is not None:
        record.valid = valid
    if target is not None:
        record.target = target
    record.save(run_dir)


def previous_training(run_dir: Path, resumed_step: Optional[int]) -> Compute:
    """The compute totals a resumed run adds to: the record's, if it describes the resumed update."""
    if resumed_step is None:
        return Compute()
    training = RunRecord.load(run_dir).training
    return training.compute() if training is not None and training.updates == resumed_step else Compute()


def record_restart(run_dir: Path, restart: Restart) -> None:
    """train's note of a restarted attempt, beside those before it."""
    record = RunRecord.load(run_dir)
    record.restarts = [*(record.restarts or []), restart]
    record.save(run_dir)


def record_score(run_dir: Path, score: Score) -> None:
    """bleu's part: a scored report (sacreBLEU, chrF, tokenized BLEU with their signatures). A
    scoring of a held-out split is added to every earlier one; any other replaces an earlier
    score of the same translations."""
    record = RunRecord.load(run_dir)
    kept = record.scores or []
    if not score.held_out:
        kept = [s for s in kept if s.hyp != score.hyp]
    record.scores = kept + [score]
    record.save(run_dir)


def checkpoint_key(run_dir: Path, checkpoint: Path) -> str:
    """A checkpoint as the record names it: relative to run_dir where it lies inside (the record
    moves with its run), else its absolute path."""
    resolved, root = Path(checkpoint).resolve(), Path(run_dir).resolve()
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else str(resolved)


def record_length_penalty(run_dir: Path, checkpoint: Path, entry: Dict[str, Any]) -> None:
    """tune's choice for one checkpoint, for the run's history: its last entry, and each
    checkpoint's. What decode uses travels with the weights (checkpoint.GenerationSettings)."""
    record = load(run_dir)
    record[LENGTH_PENALTY] = entry
    record.setdefault(LENGTH_PENALTIES, {})[checkpoint_key(run_dir, checkpoint)] = entry
    save(run_dir, record)


def tuned_by_older_version(run_dir: Path, checkpoint: Path) -> Optional[float]:
    """The alpha a translate tune from before GenerationSettings recorded for this checkpoint in
    the run record alone (its entry names no weights' fingerprint); None where there is none."""
    record = load(run_dir)
    entry = record[LENGTH_PENALTIES].get(checkpoint_key(run_dir, checkpoint)) if LENGTH_PENALTIES in record else record.get(LENGTH_PENALTY)
    older = isinstance(entry, dict) and isinstance(entry.get("alpha"), (int, float)) and "fingerprint" not in (entry.get("weights") or {})
    return float(entry["alpha"]) if older else None


def run_dirs(folders: List[str]) -> List[Path]:
    """The runs of the given folders: a run (it has a run record) stands for itself, a multirun's
    folder for its jobs (the folders below it with a record); anything else is refused."""
    runs: List[Path] = []
    for folder in map(Path, folders):
        if paths.run_record(folder).is_file():
            runs.append(folder)
            continue
        jobs = sorted(p.parent for p in folder.glob(f"*/{paths.RUN_RECORD}")) if folder.is_dir() else []
        if not jobs:
            raise TranslateError(f"{folder} is not a run: it has no {paths.RUN_RECORD} (translate train writes one), "
                                 "nor has any folder below it")
        runs.extend(jobs)
    return runs
