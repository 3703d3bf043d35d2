#!/usr/bin/env python
"""Two presets' runs paired by seed, from their run records alone: for the tuned dev split and
each held-out split, each seed's difference (candidate minus baseline), their mean and sample
standard deviation, and on how many seeds the candidate was ahead. Both sides must have run the
same seeds and scored the same splits: a comparison refuses what it could not pair.

Runs of one seed share their batches and initial weights, so a difference within a seed is
freer of the seed's luck than the difference of two means; the line states both presets and
every seed, so that a page reads the comparison's two sides from one place.

    .venv/bin/python scripts/paired_seeds.py docs/records-zen3/multi30k_lowercase_fitted_warmup-zen3-1t-seed* \\
        --against docs/records-zen3/multi30k_lowercase-zen3-1t-seed* --output docs/figures/NAME.jsonl

Lines: {"measurement": "paired", "split": "tuned_dev" or a test split, "candidate" and "baseline"
(each side's preset), "metric", "seeds", "n", each side's values, mean and sd, "differences" (and
as a page writes them, "differences_text"), "mean_difference", "sd_difference" (None below two
seeds), "candidate_ahead"}. The tuned dev split's score is the sacreBLEU `translate tune` chose
its alpha by; a test split's is the one results_tables.py reports (the data set's literature's,
its first scoring). Page marks pick one: `paired[split=test]` (scripts/fill_figures.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import results_tables  # noqa: E402
from dev_candidates import emit  # noqa: E402
from translate.core import run_record  # noqa: E402
from translate.core.errors import TranslateError  # noqa: E402
from translate.verbs import table  # noqa: E402

DEV = "tuned_dev"


def side(runs: List[Path]) -> Dict[str, Any]:
    """One side's preset and, per split, {seed: value}: the tuned dev score and each held-out split's."""
    presets = set()
    splits: Dict[str, Dict[int, float]] = {}
    records = {run: run_record.RunRecord.load(run) for run in runs}  # read once, for both loops
    for run, record in records.items():
        presets.add(results_tables.preset_of(record))
        seed = record.setting("train", "seed")
        tuned, _ = table.tuned(record)
        if tuned is not None:
            splits.setdefault(DEV, {})[seed] = tuned
    for row in results_tables.rows(runs, loaded=records):
        for entry in row["runs"]:
            splits.setdefault(row["split"], {})[entry["seed"]] = entry["value"]
    if len(presets) != 1:
        raise TranslateError(f"one side's runs name {len(presets)} presets ({', '.join(sorted(presets))}): give each side one")
    preset, = presets
    for split, values in splits.items():
        if len(values) != len(runs):
            raise TranslateError(f"{preset}: {len(runs)} runs but {len(values)} seeds scored {split} "
                                 "(two runs of one seed, or a run that did not score it)")
    return {"preset": preset, "splits": splits}


def sd(values: List[float]) -> Optional[float]:
    """The sample standard deviation; None below two values."""
    return statistics.stdev(values) if len(values) > 1 else None


def lines(candidate: List[Path], baseline: List[Path]) -> List[Dict[str, Any]]:
    ours, theirs = side(candidate), side(baseline)
    # A split one side never scored would otherwise drop out of the comparison unsaid.
    for split in sorted(set(ours["splits"]) ^ set(theirs["splits"])):
        scored, unscored = ("candidate's", "baseline's") if split in ours["splits"] else ("baseline's", "candidate's")
        raise TranslateError(f"{split}: scored by the {scored} runs but not the {unscored}")
    out = []
    for split, values in ours["splits"].items():
        others = theirs["splits"][split]
        if set(values) != set(others):
            raise TranslateError(f"{split}: the candidate's seeds {sorted(values)} are not the baseline's {sorted(others)}")
        seeds = sorted(values)
        differences = [values[seed] - others[seed] for seed in seeds]
        out.append({"measurement": "paired", "split": split, "candidate": ours["preset"], "baseline": theirs["preset"],
                    "metric": "sacrebleu" if split == DEV else "literature", "seeds": seeds, "n": len(seeds),
                    "candidate_values": [values[seed] for seed in seeds],
                    "baseline_values": [others[seed] for seed in seeds],
                    "candidate_mean": statistics.mean(values.values()), "baseline_mean": statistics.mean(others.values()),
                    "candidate_sd": sd(list(values.values())), "baseline_sd": sd(list(others.values())),
                    "differences": differences, "differences_text": ", ".join(f"{d:+.2f}" for d in differences),
                    "mean_difference": statistics.mean(differences),
                    "sd_difference": sd(differences),
                    "candidate_ahead": sum(difference > 0 for difference in differences)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("candidate", nargs="+", help="the candidate preset's run folders, a seed each")
    parser.add_argument("--against", nargs="+", required=True, help="the baseline preset's run folders, the same seeds")
    parser.add_argument("--output", type=Path, help="also write the lines to this file")
    parser.add_argument("--replace", action="store_true", help="write over an existing --output")
    args = parser.parse_args()
    emit("paired_seeds.py", args.output, args.replace,
         lambda: lines(run_record.run_dirs(args.candidate), run_record.run_dirs(args.against)))


if __name__ == "__main__":
    main()
