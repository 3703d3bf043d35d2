"""Where each verb reads and writes inside run_dir, so that the verbs chain by default."""

from __future__ import annotations

from pathlib import Path

from translate.config import TranslateConfig

LAST_CHECKPOINT = "checkpoint_last.pt"


def checkpoint(cfg: TranslateConfig) -> Path:
    """decode.checkpoint, else the last checkpoint that train wrote."""
    return Path(cfg.decode.checkpoint) if cfg.decode.checkpoint else Path(cfg.run_dir) / LAST_CHECKPOINT


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
