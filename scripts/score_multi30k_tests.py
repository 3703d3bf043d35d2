#!/usr/bin/env python
"""The three Multi30k test sets, decoded once with a run's chosen checkpoint and settings (chosen on
the dev split, e.g. by scripts/sweep_multi30k.py) and scored by `translate bleu`, which records
each scoring in the run's record (when, the weights and search decode used, the code, the
machine, every score): one JSON line per test set, the Multi30k literature's score (lowercased
tokenized BLEU) and sacreBLEU against the references decode wrote (lowercased for a model of
lowercased text). Each run of this script is one more scoring of each test set, and the record
counts it (`translate table`, scripts/results_tables.py).

    .venv/bin/python scripts/score_multi30k_tests.py RUN_DIR CHECKPOINT --beam 5 --alpha 3.0
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from bench_multi30k import ROOT, TESTS
from sweep_multi30k import MULTI30K  # the data its runs were trained on


def translate(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "translate", *args], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir")
    parser.add_argument("checkpoint")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--config", default="tiny", help="the run's preset (its data and model settings)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides of decode and bleu")
    args = parser.parse_args()
    run = Path(args.run_dir).resolve()
    common = [f"config={args.config}", f"data.path={MULTI30K}", f"run_dir={run}", *args.set]
    for split, name in TESTS.items():
        output = run / "tests" / f"{split}-{Path(args.checkpoint).stem}-beam{args.beam}-alpha{args.alpha}.de"
        output.parent.mkdir(exist_ok=True)
        translate("decode", *common, f"decode.checkpoint={Path(args.checkpoint).resolve()}", f"decode.split={split}",
                  f"decode.beam_size={args.beam}", f"decode.length_penalty={args.alpha}", f"decode.output={output}")
        report = json.loads(translate("bleu", *common, f"bleu.hyp={output}", f"bleu.ref={output}.ref", "bleu.format=json"))
        scores = report["scores"]
        bp = re.search(r"BP = ([\d.]+)", scores["sacrebleu"]["text"])
        print(json.dumps({"split": name, "checkpoint": str(args.checkpoint), "beam": args.beam, "alpha": args.alpha,
                          "lowercased_tokenized_bleu": round(scores["lowercased_tokenized_bleu"]["value"], 2),
                          "sacrebleu": round(scores["sacrebleu"]["value"], 2), "bp": float(bp.group(1)) if bp else None,
                          "recorded_in": str(run / "run_record.json")}), flush=True)


if __name__ == "__main__":
    main()
