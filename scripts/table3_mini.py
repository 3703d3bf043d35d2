#!/usr/bin/env python
"""A miniature of the paper's Table 3 on this machine: tiny-scale variants trained on Multi30k
for a fixed number of updates each (updates, not minutes, so that other load on the machine
does not change the result), decoded (beam 4, the average of the last checkpoints) and scored,
then printed side by side by `translate table`.

Runs of one setting differ by a few BLEU at this scale, more than most of Table 3's effects:
the default runs with several seeds to show that spread, and dev perplexity leads.

    .venv/bin/python scripts/table3_mini.py --updates 600            # about an hour on 2 cores
    .venv/bin/python scripts/table3_mini.py --updates 200 --seeds 1 2 # a quicker look

Each run's JSON line goes to stdout as it ends; the table follows (markdown).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from translate.config import TABLE_3  # noqa: E402

# The rows of Table 3 (translate.config.TABLE_3) run at the tiny size (d_model 256, 4 heads
# of 64, 3+3 layers): one of each kind the tiny model can show.
ROWS = ["A h=1", "B d_k=16", "D P_drop=0.0", "E learned positions", "pre-norm"]


def translate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "translate", *args], cwd=ROOT, capture_output=True, text=True, check=True)


def run(name: str, overrides: List[str], folder: Path, updates: int) -> Path:
    """Train, decode the test split and score it; returns the run_dir."""
    run_dir = folder / name.split(":")[0].replace(" ", "_").replace("=", "")
    every = max(1, updates // 4)  # four numbered checkpoints and validations; decode averages the last three
    common = ["config=tiny", *overrides, f"run_dir={run_dir}", f"train.max_steps={updates}",
              f"checkpoint.every_steps={every}", f"valid.every_steps={every}", "valid.bleu_sentences=300"]
    started = time.monotonic()
    translate("train", *common)
    translate("decode", *common)
    translate("bleu", *common)
    print(json.dumps({"run": name, "run_dir": str(run_dir), "updates": updates,
                      "minutes": round((time.monotonic() - started) / 60, 1)}), flush=True)
    return run_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=600, help="updates per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds of the default runs")
    parser.add_argument("--folder", default="runs/table3-mini")
    args = parser.parse_args()
    folder = Path(args.folder)
    runs = [run(f"default seed {seed}", [f"train.seed={seed}"], folder, args.updates) for seed in args.seeds]
    runs += [run(name, TABLE_3[name].overrides, folder, args.updates) for name in ROWS]
    print(translate("table", f"table.runs=[{','.join(map(str, runs))}]").stdout, end="")


if __name__ == "__main__":
    main()
