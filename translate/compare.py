"""The `translate table` verb: runs side by side, as the paper's Table 3 shows its variants.

Each run is read from its run record (run_record.json, which train keeps and bleu adds to): the
settings that differ between the runs, parameters, updates, training compute, the last
validation's dev loss, perplexity and BLEU, the test BLEU where the run's decode was scored, and
the minutes and updates to train.target_bleu where a run had one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, Iterator, List

from translate import paths
from translate.training import run_record
from translate.config import TableFormat, TranslateConfig
from translate.errors import TranslateError

# Settings that name where things are, not what was trained: never a column of their own.
PLACES = ("run_dir", "data.cache_dir", "decode.output", "decode.input", "decode.checkpoint", "bleu.hyp", "bleu.ref",
          "bleu.baseline", "export.output", "export.checkpoint", "train.init_from")


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


def _leaves(tree: Dict[str, Any], prefix: str = "") -> Iterator[tuple]:
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def rows(runs: List[Path]) -> List[Dict[str, Any]]:
    """One row per run: its differing settings, then what it cost and what it scored."""
    records = [run_record.load(run) for run in runs]
    settings = [dict(_leaves(record.get("settings", {}))) for record in records]
    keys = sorted({key for s in settings for key in s} - set(PLACES))
    differing = [key for key in keys if len({json.dumps(s.get(key)) for s in settings}) > 1]
    table = []
    for run, record, setting in zip(runs, records, settings):
        valid, training = record.get("valid") or {}, record.get("training", {})
        scores = record.get("scores") or [{}]
        test_bleu = scores[-1].get("scores", {}).get("sacrebleu", {}).get("value")
        row = {"run": str(run), **{key: setting.get(key) for key in differing},
               "params": record.get("model", {}).get("parameters"), "updates": training.get("updates"),
               "train_flops": training.get("model_flops"), "dev_loss": valid.get("loss"),
               "dev_ppl": math.exp(valid["nll"]) if "nll" in valid else None, "dev_bleu": valid.get("bleu"),
               "test_bleu": test_bleu}
        if any("target" in r for r in records):  # train.target_bleu: the time to it, from the process start
            target = record.get("target") or {}
            row["target_minutes"] = target["process_seconds"] / 60 if target else None
            row["target_updates"] = target.get("update")
        table.append(row)
    return table


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) >= 1e5 else f"{value:.2f}"
    if isinstance(value, int) and abs(value) >= 1e5:
        return f"{value / 1e6:.1f}M"
    return str(value)


def markdown(table: List[Dict[str, Any]]) -> str:
    columns = list(table[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row[column]) for column in columns) + " |" for row in table]
    return "\n".join(lines)


def table(cfg: TranslateConfig) -> List[Dict[str, Any]]:
    """Print table.runs side by side (markdown, or json with table.format=json); returns the rows."""
    if not cfg.table.runs:
        raise TranslateError("no runs to show: table.runs=[DIR1,DIR2,...] (a multirun's folder stands for its jobs)")
    rows_ = rows(run_dirs(cfg.table.runs))
    print(json.dumps(rows_) if cfg.table.format == TableFormat.json else markdown(rows_))
    return rows_
