#!/usr/bin/env python
"""The three Multi30k test sets, decoded once with a run's chosen checkpoint and settings (chosen on
the dev split, e.g. by scripts/sweep_multi30k.py) and scored as the Multi30k literature scores
(lowercased tokenized BLEU) and as sacreBLEU does: one JSON line per test set.

    .venv/bin/python scripts/score_multi30k_tests.py RUN_DIR CHECKPOINT --beam 5 --alpha 3.0
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench_multi30k import ROOT, TESTS, raw_lines, scores
from sweep_multi30k import MULTI30K  # the data its runs were trained on


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir")
    parser.add_argument("checkpoint")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--config", default="tiny", help="the run's preset (its data and model settings)")
    args = parser.parse_args()
    run = Path(args.run_dir).resolve()
    for split, name in TESTS.items():
        output = run / "tests" / f"{split}-{Path(args.checkpoint).stem}-beam{args.beam}-alpha{args.alpha}.de"
        output.parent.mkdir(exist_ok=True)
        subprocess.run([sys.executable, "-m", "translate", "decode", f"config={args.config}", f"data.path={MULTI30K}",
                        f"run_dir={run}", f"decode.checkpoint={Path(args.checkpoint).resolve()}", f"decode.split={split}",
                        f"decode.beam_size={args.beam}", f"decode.length_penalty={args.alpha}", f"decode.output={output}"],
                       cwd=ROOT, check=True, capture_output=True)
        print(json.dumps({"split": name, "checkpoint": str(args.checkpoint), "beam": args.beam, "alpha": args.alpha,
                          **scores(output.read_text(encoding="utf-8").splitlines(), raw_lines(name, "de"))}), flush=True)


if __name__ == "__main__":
    main()
