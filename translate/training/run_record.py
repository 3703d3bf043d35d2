"""The run record: one JSON file in run_dir that says what a run is and what it has done.

train keeps it current (settings, languages, data, model size, updates, training compute summed
across resumes, the last validation's metrics, the commands run); bleu adds each scored report
with its signatures; tune the length penalty it chose on the dev split. The transformers
export's model card is written from it.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, Optional

from translate import paths
from translate.config import PAPER_LENGTH_PENALTY

LENGTH_PENALTY = "length_penalty"  # tune's entry: the alpha chosen on the dev split and the scores behind it


def load(run_dir: Path) -> Dict[str, Any]:
    """The record of run_dir; empty where there is none (or it cannot be read)."""
    try:
        return json.loads(paths.run_record(run_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def save(run_dir: Path, record: Dict[str, Any]) -> None:
    """Write atomically: readers see the old record or the new one."""
    with paths.atomic_write(paths.run_record(run_dir)) as file:
        file.write(json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def command_line(verb: str) -> str:
    """This process's command as a user would type it: `translate VERB OVERRIDES...` (the CLI
    leaves sys.argv as [translate-VERB, OVERRIDES...] for Hydra)."""
    overrides = sys.argv[1:] if sys.argv[0].startswith("translate-") else []
    return " ".join(["translate", verb, *map(shlex.quote, overrides)])


def record_training(run_dir: Path, settings: Dict[str, Any], data: Dict[str, Any], model: Dict[str, Any],
                    training: Dict[str, Any], valid: Optional[Dict[str, Any]],
                    target: Optional[Dict[str, Any]] = None) -> None:
    """train's part, rewritten at every checkpoint: `training` holds the updates and the compute
    totals over every run that led to this checkpoint; `target`, when train.target_bleu was
    reached, the time and compute to it."""
    record = load(run_dir)
    commands = record.get("commands", [])
    if command_line("train") not in commands:
        commands.append(command_line("train"))
    record.update(settings=settings, data=data, model=model, training=training, commands=commands)
    if valid is not None:
        record["valid"] = valid
    if target is not None:
        record["target"] = target
    save(run_dir, record)


def previous_training(run_dir: Path, resumed_step: Optional[int]) -> Dict[str, float]:
    """The compute totals a resumed run adds to: the record's, if it describes the resumed update."""
    training = load(run_dir).get("training", {})
    if resumed_step is None or training.get("updates") != resumed_step:
        return {"seconds": 0.0, "model_flops": 0.0, "target_tokens": 0.0}
    return {key: float(training.get(key, 0.0)) for key in ("seconds", "model_flops", "target_tokens")}


def record_score(run_dir: Path, report: Dict[str, Any]) -> None:
    """bleu's part: the scored report (sacreBLEU, chrF, tokenized BLEU with their signatures),
    replacing an earlier score of the same translations."""
    record = load(run_dir)
    scores = [s for s in record.get("scores", []) if s.get("hyp") != report.get("hyp")]
    scores.append(report)
    record["scores"] = scores
    save(run_dir, record)


def chosen_length_penalty(run_dir: str) -> float:
    """The alpha `translate tune` chose for run_dir; the paper's 0.6 where it has not (the
    resolver behind decode.length_penalty's default on the command line, configs/common.yaml)."""
    chosen = load(Path(run_dir)).get(LENGTH_PENALTY, {}).get("alpha")
    return float(chosen) if isinstance(chosen, (int, float)) else PAPER_LENGTH_PENALTY
