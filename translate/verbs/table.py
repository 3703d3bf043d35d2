"""The `translate table` verb: runs side by side, as the paper's Table 3 shows its variants.

Each run is read from its run record (run_record.json, which train keeps and bleu adds to): the
settings that differ between the runs, parameters, updates, training compute, the last
validation's dev loss, perplexity and BLEU, the dev BLEU at the length penalty `translate tune`
chose and that alpha (where any run was tuned), the test BLEU where the run's decode was scored and
how many times its test split was scored (where any run's was), the minutes and updates to
train.target_bleu where a run had one, and torchrun's restarts where a run had any. Runs that
differ only in train.seed are one row: the mean of each measure, its standard deviation
(<measure>_std) and the number of seeds (n).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from translate.core import run_record
from translate.core.choices import TableFormat
from translate.core.config import ADDED_LATER, TranslateConfig
from translate.core.errors import TranslateError
from translate.core.run_record import RunRecord

# Settings that name where things are, not what was trained: never a column of their own.
PLACES = ("run_dir", "data.cache_dir", "decode.output", "decode.input", "decode.checkpoint", "bleu.hyp", "bleu.ref",
          "bleu.baseline", "export.output", "export.checkpoint", "train.init_from")
# The settings of the verbs that only read runs (and that older records lack): never a column.
READERS = ("table.", "plot.", "tune.")
SEED = "train.seed"
# What a run measured: over the seeds of one row, a mean and a standard deviation each.
MEASURES = ("updates", "train_flops", "dev_loss", "dev_ppl", "dev_bleu", "tuned_dev_bleu", "tuned_alpha", "test_bleu",
            "target_minutes", "target_updates", "restarts")
SCORINGS = "test_scorings"  # how many times each run's test split was scored: a count per run, never averaged


def leaves(tree: Dict[str, Any], prefix: str = "") -> Iterator[tuple]:
    """(dotted key, value) for each setting in a record's nested settings: "optim.warmup_ratio"."""
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def rows(runs: List[Path]) -> List[Dict[str, Any]]:
    """One row per run, or per setting of runs that differ only in train.seed (by_seeds)."""
    return by_seeds(run_rows(runs))


def run_rows(runs: List[Path]) -> List[Dict[str, Any]]:
    """One row per run: its differing settings, then what it cost and what it scored."""
    records = [RunRecord.load(run) for run in runs]
    # A setting added after a run was recorded: the value it trained at (ADDED_LATER), not a blank.
    settings = [{**ADDED_LATER, **dict(leaves(record.settings or {}))} for record in records]
    keys = sorted(key for key in {key for s in settings for key in s} - set(PLACES) if not key.startswith(READERS))
    differing = [key for key in keys if len({json.dumps(s.get(key)) for s in settings}) > 1]
    table = []
    for run, record, setting in zip(runs, records, settings):
        valid, training, model = record.valid, record.training, record.model
        row = {"run": str(run), **{key: setting.get(key) for key in differing},
               "params": model.parameters if model else None, "updates": training.updates if training else None,
               "train_flops": training.model_flops if training else None, "dev_loss": valid.loss if valid else None,
               "dev_ppl": valid.perplexity if valid else None, "dev_bleu": valid.bleu if valid else None,
               "test_bleu": record.test_bleu()}
        if any(run_record.LENGTH_PENALTY in r.others for r in records):  # translate tune's choice on the dev split
            row["tuned_dev_bleu"], row["tuned_alpha"] = tuned(record)
        if any(r.test_scorings() for r in records):  # a test split scored twice has been seen twice
            row[SCORINGS] = len(record.test_scorings())
        if any(r.target is not None for r in records):  # train.target_bleu: the time to it, from the process start
            target = record.target
            row["target_minutes"] = target.process_seconds / 60 if target else None
            row["target_updates"] = target.update if target else None
        if any(r.restarts for r in records):  # torchrun's restarts after a fault (--max-restarts)
            row["restarts"] = len(record.restarts or [])
        table.append(row)
    return table


def tuned(record: RunRecord) -> tuple:
    """(dev sacreBLEU at the alpha `translate tune` chose, that alpha): its last choice, with the
    beam and weights it decoded; (None, None) where the run was not tuned. Candidates are compared
    on this, the dev split's score as the preset's chain decodes, never on a test split."""
    entry = record.others.get(run_record.LENGTH_PENALTY)
    if not isinstance(entry, dict):
        return None, None
    chosen = [score["sacrebleu"] for score in entry.get("scores", []) if score.get("alpha") == entry.get("alpha")]
    return (chosen[-1] if chosen else None), entry.get("alpha")


def by_seeds(table: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The rows of runs that differ only in train.seed as one: the seeds, their number (n), and
    each measure's mean and sample standard deviation (<measure>_std; None below 2 values),
    in the order the settings first come. The rows as they are where no two runs share their
    other settings."""
    if not table or SEED not in table[0]:
        return table
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for row in table:
        setting = {key: value for key, value in row.items() if key not in ("run", SEED, SCORINGS, *MEASURES)}
        groups.setdefault(json.dumps(setting, sort_keys=True, default=str), []).append(row)
    if all(len(group) == 1 for group in groups.values()):
        return table
    return [seeds_row(group) for group in groups.values()]


def seeds_row(group: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Rows of one setting's seeds as one: the seeds, n, and each measure's mean and sample
    standard deviation (<measure>_std; None below 2 values)."""
    row = {key: value for key, value in group[0].items() if key not in (*MEASURES, "params")}  # the settings
    row.update({"run": ", ".join(r["run"] for r in group), SEED: [r.get(SEED) for r in group], "n": len(group),
                "params": group[0]["params"]})
    if SCORINGS in row:
        row[SCORINGS] = [r[SCORINGS] for r in group]  # each seed's, as its seed
    for measure in (m for m in MEASURES if m in group[0]):
        values = [r[measure] for r in group if r[measure] is not None]
        row[measure] = statistics.mean(values) if values else None
        row[f"{measure}_std"] = statistics.stdev(values) if len(values) > 1 else None
    return row


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) >= 1e5 else f"{value:.2f}"
    if isinstance(value, int) and abs(value) >= 1e5:
        return f"{value / 1e6:.1f}M"
    return str(value)


def _spread(value: Any, std: Optional[float]) -> str:
    """A cell, with its standard deviation over seeds where it has one: `mean ± std`."""
    return _cell(value) if std is None else f"{_cell(value)} ± {_cell(std)}"


def markdown(table: List[Dict[str, Any]]) -> str:
    columns = [column for column in table[0] if not (column.endswith("_std") and column[:-4] in table[0])]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_spread(row[column], row.get(f"{column}_std")) for column in columns) + " |"
              for row in table]
    return "\n".join(lines)


def table(cfg: TranslateConfig) -> List[Dict[str, Any]]:
    """Print table.runs side by side (markdown, or json with table.format=json); returns the rows."""
    if not cfg.table.runs:
        raise TranslateError("no runs to show: table.runs=[DIR1,DIR2,...] (a multirun's folder stands for its jobs)")
    rows_ = rows(run_record.run_dirs(cfg.table.runs))
    print(json.dumps(rows_) if cfg.table.format == TableFormat.json else markdown(rows_))
    return rows_
