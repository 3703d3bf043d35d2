#!/usr/bin/env python
"""Recipe candidates on the dev split, from their run records alone (issue 53: a recipe is chosen
on dev, never on a test split): `translate table`'s rows as one JSON line per run, then one per
setting over its seeds. Each names the settings that differ between the runs given, the updates,
the last validation's dev loss and greedy dev BLEU (and its update), the epochs trained (target
tokens over the corpus's: comparable across vocabularies, where updates of as many tokens are not),
the model's parameters, the dev BLEU at the alpha `translate tune` chose (its beam, its averaged
weights) and, where the baseline (the first run's settings) ran the same seed, that less the baseline's.

    .venv/bin/python scripts/dev_candidates.py /work/runs/seed8 /work/runs/cand-rdrop5-seed11
    .venv/bin/python scripts/dev_candidates.py RUN... --output docs/figures/multi30k_dev_candidates_zen5.jsonl --replace

Lines: {"measurement": "dev_run", "label": the run folder's name, ...} for each run, then
{"measurement": "dev_candidate", "setting": "train.rdrop=5.0" (the differing settings, or
"baseline" where they are the first run's), "n": seeds, and each measure's mean and sd, and over the
"paired_seeds" the baseline also ran, the mean and sd of "tuned_dev_bleu_vs_baseline"}. Page
marks pick one: `dev_run[label=NAME]` or `dev_candidate[setting=...]` (scripts/fill_figures.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from translate.core.errors import TranslateError  # noqa: E402
from translate.core import run_record  # noqa: E402
from translate.core.run_record import run_dirs  # noqa: E402
from translate.verbs import table  # noqa: E402

MEASURES = ("updates", "dev_loss", "dev_bleu", "tuned_dev_bleu", "tuned_alpha")


def lines(runs: List[Path]) -> List[Dict]:
    rows = table.run_rows(runs)
    settings = [key for key in rows[0] if key not in ("run", "params", table.SEED, table.SCORINGS, *table.MEASURES)]
    out, groups = [], {}
    for row in rows:
        record = run_record.RunRecord.load(Path(row["run"]))  # once: the seed where the row lacks it, the progress
        differing = {key: row[key] for key in settings}
        label = " ".join(f"{key}={value}" for key, value in differing.items() if value != rows[0][key]) or "baseline"
        # A table row names the seed only where seeds differ; else it is read from the record.
        seed = row[table.SEED] if table.SEED in row else ((record.settings or {}).get("train") or {}).get("seed")
        out.append({"measurement": "dev_run", "label": Path(row["run"]).name, "run": row["run"], "setting": label,
                    "seed": seed, **differing, **{m: row.get(m) for m in MEASURES}, **_progress(record)})
        groups.setdefault(label, []).append({**row, table.SEED: seed})
    # A candidate's run beside the baseline's run of its seed (the same batches): the paired difference.
    baseline = {line["seed"]: line["tuned_dev_bleu"] for line in out if line["setting"] == "baseline"}
    for line in out:
        ours = line["tuned_dev_bleu"]
        theirs = baseline.get(line["seed"]) if line["setting"] != "baseline" else None
        line["tuned_dev_bleu_vs_baseline"] = ours - theirs if ours is not None and theirs is not None else None
    for label, group in groups.items():
        seeds = table.seeds_row(group)  # translate table's mean and sd over seeds
        summary = {"measurement": "dev_candidate", "setting": label, "n": seeds["n"], "seeds": seeds[table.SEED]}
        for measure in MEASURES:
            summary[measure], summary[f"{measure}_sd"] = seeds.get(measure), seeds.get(f"{measure}_std")
        # Over the seeds the baseline also ran: the mean of the paired differences, and their sd.
        paired = [line["tuned_dev_bleu_vs_baseline"] for line in out if line["measurement"] == "dev_run"
                  and line["setting"] == label and line["tuned_dev_bleu_vs_baseline"] is not None]
        summary["paired_seeds"] = len(paired)
        summary["tuned_dev_bleu_vs_baseline"] = statistics.mean(paired) if paired else None
        summary["tuned_dev_bleu_vs_baseline_sd"] = statistics.stdev(paired) if len(paired) > 1 else None
        out.append(summary)
    return out


def _progress(record: run_record.RunRecord) -> Dict:
    """The update of the run's last validation, the epochs its training's target tokens make, and
    the model's parameters (a candidate may change the model's size)."""
    epoch = (record.data.epoch_tokens or record.data.train_tokens) if record.data else None  # BPE-dropout's are longer
    corpus = epoch.target if epoch else None
    trained = record.training.target_tokens if record.training else None
    return {"dev_update": record.valid.update if record.valid else None,
            "epochs": round(trained / corpus, 2) if trained and corpus else None,
            "parameters": record.model.parameters if record.model else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders (the first: the baseline); a multirun's folder for its jobs")
    parser.add_argument("--output", type=Path, help="also write the lines to this file")
    parser.add_argument("--replace", action="store_true", help="write over an existing --output")
    args = parser.parse_args()
    emit("dev_candidates.py", args.output, args.replace, lambda: lines(run_dirs(args.runs)))


def emit(script: str, output: Optional[Path], replace: bool, produce: Callable[[], List[Dict]]) -> None:
    """Print the JSON lines produce() makes, and write them to output; a TranslateError, or an
    output that exists without replace, is one line naming it and a non-zero exit, with nothing written."""
    if output and output.exists() and not replace:
        sys.exit(f"{script}: error: {output} exists (--replace writes over it)")
    try:
        text = "".join(json.dumps(line) + "\n" for line in produce())
    except TranslateError as error:
        sys.exit(f"{script}: error: {error}")
    print(text, end="")
    if output:
        output.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
