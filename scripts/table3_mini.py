#!/usr/bin/env python
"""A miniature of the paper's Table 3 on this machine: tiny-scale variants trained on Multi30k
for a fixed number of updates each (updates, not minutes, so that other load on the machine
does not change the result), every row with several seeds, compared on the dev split as the
paper's Table 3 is (newstest2013 there): dev perplexity and dev BLEU (greedy, 300 sentences).

Runs of one setting differ by more than most of Table 3's effects at this scale, so each row
is the mean ± standard deviation of its seeds (`translate table` groups them), and a row
differs from the default where the difference of the means exceeds two standard deviations
of that difference: sqrt(s_row^2 / n_row + s_default^2 / n_default).

    .venv/bin/python scripts/table3_mini.py --updates 400           # 3 seeds x 6 rows: about 75 minutes on 2 cores
    .venv/bin/python scripts/table3_mini.py --updates 200 --seeds 1 2 # a quicker look
    .venv/bin/python scripts/table3_mini.py --test                   # also decode (beam 4) and score the test split

Seeds go round the rows (every row's seed 1 first), so that a sweep stopped early still has
whole seeds; a run that already holds its updates is not trained again. Each run's JSON line
goes to stdout as it ends, then one per row with its verdict, then the table (markdown); the
error-bar figure (table3.png) and each row's curves, the mean of its seeds (curves.png), go in
--folder.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple


from translate import figures
from translate.core import paths, run_record
from translate.core.variants import TABLE_3
from translate.verbs import plot, table

ROOT = Path(__file__).resolve().parents[1]

DEFAULT = "default"
# The rows of Table 3 (translate.core.variants.TABLE_3) run at the tiny size (d_model 256, 4 heads
# of 64, 3+3 layers): one of each kind the tiny model can show.
ROWS = ["A h=1", "B d_k=16", "D P_drop=0.0", "E learned positions", "pre-norm"]
# The paper's Table 3 (newstest2013): dev perplexity and dev BLEU of the rows run here.
PAPER = {DEFAULT: (4.92, 25.8), "A h=1": (5.29, 24.9), "B d_k=16": (5.16, 25.1), "D P_drop=0.0": (5.77, 24.6),
         "E learned positions": (4.92, 25.7)}
MEASURES = (("dev_ppl", "dev perplexity", 0), ("dev_bleu", "dev BLEU (greedy, 300 sentences)", 1))


def translate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "translate", *args], cwd=ROOT, capture_output=True, text=True, check=True)


def run_dir(folder: Path, name: str, seed: int) -> Path:
    return folder / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}-seed{seed}"


def trained(run: Path, updates: int) -> bool:
    """Whether the run already holds `updates` updates and their last validation."""
    if not paths.run_record(run).is_file():
        return False
    record = run_record.load(run)
    return record.get("training", {}).get("updates") == updates and bool(record.get("valid"))


def run(name: str, overrides: List[str], seed: int, folder: Path, updates: int, test: bool) -> Path:
    """Train (and with `test`, decode the test split and score it); returns the run_dir."""
    where = run_dir(folder, name, seed)
    every = max(1, updates // 4)  # four validations (the curves' points) and numbered checkpoints
    common = ["config=tiny", *overrides, f"train.seed={seed}", f"run_dir={where}", f"train.max_steps={updates}",
              f"checkpoint.every_steps={every}", f"valid.every_steps={every}", "valid.bleu_sentences=300"]
    started = time.monotonic()
    done = trained(where, updates)
    if not done:
        translate("train", *common)
    if test:
        translate("decode", *common)
        translate("bleu", *common)
    print(json.dumps({"run": name, "seed": seed, "run_dir": str(where), "updates": updates, "trained_before": done,
                      "minutes": round((time.monotonic() - started) / 60, 1)}), flush=True)
    return where


def difference(row: Dict, default: Dict, measure: str) -> Tuple[float, Optional[float]]:
    """The row's mean minus the default's, and the standard deviation of that difference
    (None where either has a single seed)."""
    delta = row[measure] - default[measure]
    spreads = [(r.get(f"{measure}_std"), r.get("n", 1)) for r in (row, default)]
    if any(std is None for std, _ in spreads):
        return delta, None
    return delta, math.sqrt(sum(std ** 2 / n for std, n in spreads))


def verdict(name: str, row: Dict, default: Dict) -> Dict:
    """For each measure: the difference from the default, its standard deviation, whether it
    exceeds two of them, and whether its direction is the paper's."""
    found: Dict = {"row": name, "n": row.get("n", 1)}
    for measure, _, column in MEASURES:
        delta, sigma = difference(row, default, measure)
        differs = sigma is not None and abs(delta) > 2 * sigma
        entry = {"mean": _round(row[measure]), "std": _round(row.get(f"{measure}_std")), "minus_default": _round(delta),
                 "std_of_difference": _round(sigma), "beyond_2_std": differs,
                 "direction": _direction(delta) if differs else "same"}
        if name in PAPER:
            paper_delta = PAPER[name][column] - PAPER[DEFAULT][column]
            entry["paper_minus_base"] = round(paper_delta, 2)
            entry["paper_direction"] = _direction(paper_delta) if abs(paper_delta) >= 0.05 else "same"
            entry["as_in_paper"] = entry["direction"] == entry["paper_direction"]
        found[measure] = entry
    return found


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 3)


def _direction(delta: float) -> str:
    return "higher" if delta > 0 else "lower"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=400, help="updates per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds of every row")
    parser.add_argument("--rows", nargs="+", default=ROWS, choices=sorted(TABLE_3), metavar="ROW",
                        help=f"rows of translate.core.variants.TABLE_3 beside the default (default: {ROWS})")
    parser.add_argument("--folder", default="runs/table3-mini")
    parser.add_argument("--test", action="store_true", help="also decode the test split (beam 4) and score it")
    args = parser.parse_args()
    folder = Path(args.folder)
    settings = {DEFAULT: [], **{name: TABLE_3[name].overrides for name in args.rows}}
    runs: Dict[str, List[Path]] = {name: [] for name in settings}
    for seed in args.seeds:
        for name, overrides in settings.items():
            runs[name].append(run(name, overrides, seed, folder, args.updates, args.test))
    # One grouped row per setting (its seeds), named as here rather than by its overrides.
    rows = {next(name for name, found in runs.items() if str(found[0]) in row["run"].split(", ")): row
            for row in table.rows([run for found in runs.values() for run in found])}
    for name, row in rows.items():
        if name != DEFAULT:
            print(json.dumps(verdict(name, row, rows[DEFAULT])), flush=True)
    hidden = ("run", "train_flops", "test_bleu") if not args.test else ("run", "train_flops")
    print(table.markdown([{"row": name, **{k: v for k, v in row.items() if not k.startswith(hidden)}}
                            for name, row in rows.items()]))
    title = f"miniature Table 3: tiny Transformer, Multi30k EN-DE, {args.updates} updates, seeds {args.seeds}"
    figure = folder / "table3.png"
    figures.spreads([(label, [figures.Spread(name, row[measure], row.get(f"{measure}_std")) for name, row in rows.items()])
                  for measure, label, _ in MEASURES], figure, title, figures.Size(1400, 600))
    figures.write_json(figure.with_suffix(".json"), {"title": title, "rows": rows})
    curves = row_curves(runs, folder / "curves.png", title)
    print(json.dumps({"figures": [str(figure), str(curves)]}))


def row_curves(runs: Dict[str, List[Path]], path: Path, title: str) -> Path:
    """Each row's recorded training loss, dev perplexity and dev BLEU against updates, the mean
    of its seeds at the updates all of them recorded: a line per row (<stem>.json beside it)."""
    recorded = {name: [plot.recorded(run) for run in found] for name, found in runs.items()}
    means: Dict[str, Dict[str, Dict[str, list]]] = {}
    panels = []
    for metric in plot.RUN_METRICS:
        series = []
        for name, seeds in recorded.items():
            points = [seed[metric.key] for seed in seeds]
            updates = sorted(set.intersection(*(set(p.updates) for p in points)))
            values = [statistics.mean(p.values[p.updates.index(u)] for p in points) for u in updates]
            means.setdefault(name, {})[metric.key] = {"updates": updates, "values": values}
            series.append(figures.Series(name, updates, values))
        panels.append(figures.Panel("updates", f"{metric.label}, mean of seeds", series))
    figures.curve_panels(panels, path, title, figures.Size(1800, 600), columns=len(panels))
    figures.write_json(path.with_suffix(".json"), {"title": title, "runs": {n: list(map(str, f)) for n, f in runs.items()},
                                                "means": means})
    return path


if __name__ == "__main__":
    main()
