"""The run record: one JSON file in run_dir that says what a run is and what it has done.

train keeps it current (settings, languages, data, model size, updates, training compute summed
across resumes, the last validation's metrics, the commands run); bleu adds each scored report
with its signatures; tune the length penalty it chose on the dev split. The transformers
export's model card is written from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from translate.core import paths
from translate.core.errors import TranslateError

LENGTH_PENALTY = "length_penalty"  # tune's last entry: the alpha chosen on the dev split and the scores behind it
LENGTH_PENALTIES = "length_penalties"  # every checkpoint's last entry, by checkpoint_key: each keeps its own alpha


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


def record_training(run_dir: Path, settings: Dict[str, Any], data: Dict[str, Any], model: Dict[str, Any],
                    training: Dict[str, Any], valid: Optional[Dict[str, Any]], command: str,
                    target: Optional[Dict[str, Any]] = None) -> None:
    """train's part, rewritten at every checkpoint: `training` holds the updates and the compute
    totals over every run that led to this checkpoint; `command`, the train command that wrote it
    (kept beside those of earlier runs); `target`, when train.target_bleu was reached, the time
    and compute to it."""
    record = load(run_dir)
    commands = record.get("commands", [])
    if command not in commands:
        commands.append(command)
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
