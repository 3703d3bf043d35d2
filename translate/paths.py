"""Where each verb reads and writes inside run_dir, so that the verbs chain by default; and the
project root, where configs/ and local datasets are found."""

from __future__ import annotations

from pathlib import Path

from translate.config import TranslateConfig

PROJECT_ROOT = Path(__file__).resolve().parent.parent  # the checkout: configs/ and local datasets

LAST_CHECKPOINT = "checkpoint_last.pt"  # everything needed to resume; rewritten at every save
BEST_CHECKPOINT = "checkpoint_best.pt"  # the weights with the best dev metric (valid.metric)
AVERAGE_CHECKPOINT = "checkpoint_average.pt"  # the mean of the last checkpoint.average_last numbered ones


def numbered_checkpoint(run_dir: Path, step: int) -> Path:
    """The weights at one update (kept for averaging; checkpoint.keep_last of them)."""
    return run_dir / f"checkpoint_{step}.pt"


def checkpoint(cfg: TranslateConfig) -> Path:
    """decode.checkpoint; else the average when the preset asks for one (checkpoint.average_last),
    else the last checkpoint that train wrote."""
    if cfg.decode.checkpoint:
        return Path(cfg.decode.checkpoint)
    name = AVERAGE_CHECKPOINT if cfg.checkpoint.average_last > 0 else LAST_CHECKPOINT
    return Path(cfg.run_dir) / name


def decode_output(cfg: TranslateConfig) -> Path:
    """decode.output, else <run_dir>/decode/<split or input name>.<tgt_lang>."""
    if cfg.decode.output:
        return Path(cfg.decode.output)
    name = Path(cfg.decode.input).name if cfg.decode.input else cfg.decode.split
    return Path(cfg.run_dir) / "decode" / f"{name}.{cfg.data.tgt_lang}"


def decode_reference(cfg: TranslateConfig) -> Path:
    """The references decode writes beside its output when it translates a dataset split."""
    output = decode_output(cfg)
    return output.with_name(output.name + ".ref")
