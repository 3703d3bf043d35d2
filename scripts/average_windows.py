#!/usr/bin/env python
"""How many checkpoints to average, chosen on the dev split: for each run and each N of --windows,
the mean of the run's last N numbered checkpoints (translate.averaging.average, as `translate
average` builds it), its alpha chosen by `translate tune`'s own search (tune.alphas, extended while
the largest is best) and its dev sacreBLEU there. The averages are written to a temporary folder and
scored in memory: the run's folder, its record and the weights decode uses stay as they were. No
test split is decoded.

    .venv/bin/python scripts/average_windows.py /work/runs/drop04-seed14 --windows 10 20 40 --config multi30k_lowercase
    .venv/bin/python scripts/average_windows.py RUN... --windows 10 20 40 --output docs/figures/NAME.jsonl --replace

Lines: {"measurement": "average_window", "label": the run folder's name, "average_last": N,
"first"/"last": the updates of the oldest and newest checkpoint averaged, "tuned_dev_bleu", "alpha",
"bp", "vs_first_window": that less the first window's (the run's own, so paired; None where the run
has too few checkpoints for the first window), every alpha's
"scores", the machine and the commit}, then per window over the runs {"measurement":
"average_window_summary", "average_last": N, "runs", "vs_first_window" mean and "_sd", "ahead": runs
where it beat the first window}. A run with fewer than N checkpoints gets no line for N.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))  # bench_fairseq, where a test loads this file as a module

from bench_fairseq import commit, machine  # noqa: E402
from translate import averaging  # noqa: E402
from translate.core import paths  # noqa: E402
from translate.core.errors import TranslateError  # noqa: E402
from translate.hydra_cli import load_config  # noqa: E402
from translate.translator import Translator  # noqa: E402
from translate.verbs import tune  # noqa: E402


def run_lines(run: Path, windows: List[int], overrides: List[str], scratch: Path, where: Dict[str, str]) -> List[Dict]:
    """One line per window for one run (windows longer than its checkpoints left out); `where`:
    the machine and commit every line names."""
    cfg = load_config("tune", [f"run_dir={run}", *overrides])
    numbered = paths.numbered_checkpoints(run)
    lines: List[Dict] = []
    for count in windows:
        if count > len(numbered):
            print(f"{run.name}: {len(numbered)} numbered checkpoints, fewer than {count}: no line", file=sys.stderr)
            continue
        sources = numbered[-count:]
        path = scratch / f"{run.name}-average{count}.pt"
        averaged = averaging.average(sources)
        averaged.save(path)
        with contextlib.redirect_stdout(sys.stderr):  # tune's line per alpha: stdout holds the JSON lines alone
            scores, sentences = tune.dev_scores(cfg, Translator.from_checkpoint(path), path)
        best = tune.best_score(scores)
        lines.append({"measurement": "average_window", "label": run.name, "average_last": count,
                      "first": paths.numbered_update(sources[0]), "last": averaged.step,
                      "tuned_dev_bleu": best["sacrebleu"], "alpha": best["alpha"], "bp": best["bp"],
                      "split": cfg.data.valid_split, "sentences": sentences, "beam_size": cfg.decode.beam_size,
                      "scores": scores, **where})
        path.unlink()
    first = next((line["tuned_dev_bleu"] for line in lines if line["average_last"] == windows[0]), None)
    for line in lines:  # None where the run has too few checkpoints for the reference window
        line["vs_first_window"] = None if first is None else round(line["tuned_dev_bleu"] - first, 2)
    return lines


def summaries(lines: List[Dict]) -> List[Dict]:
    """Per window, over the runs: the mean and sd of its difference from each run's first window."""
    out = []
    for count in dict.fromkeys(line["average_last"] for line in lines):
        gains = [line["vs_first_window"] for line in lines if line["average_last"] == count and line["vs_first_window"] is not None]
        if not gains:
            continue
        out.append({"measurement": "average_window_summary", "average_last": count, "runs": len(gains),
                    "vs_first_window": round(statistics.mean(gains), 2),
                    "vs_first_window_sd": round(statistics.stdev(gains), 2) if len(gains) > 1 else None,
                    "ahead": sum(gain > 0 for gain in gains)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders with numbered checkpoints")
    parser.add_argument("--windows", nargs="+", type=int, default=[10, 20, 40], help="N: average the last N; the first is the reference")
    parser.add_argument("--config", default="multi30k_lowercase", help="the runs' preset (data, decode and tune settings)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides (data, decode, tune)")
    parser.add_argument("--output", type=Path, help="also write the lines to this file (refused where it exists)")
    parser.add_argument("--replace", action="store_true", help="write over an existing --output")
    args = parser.parse_args()
    if any(count < 1 for count in args.windows):
        parser.error("--windows: each N must be at least 1")
    for run in args.runs:  # before any decoding
        if not paths.numbered_checkpoints(run):
            parser.error(f"{run} holds no numbered checkpoints (checkpoint_<update>.pt) to average")
    if args.output and args.output.exists() and not args.replace:
        parser.error(f"{args.output} exists (--replace writes over it)")
    lines: List[Dict] = []
    where = {"machine": machine(), "commit": commit()}
    with tempfile.TemporaryDirectory(prefix="average-windows-") as scratch:
        for run in args.runs:
            try:  # a damaged checkpoint, a bad setting: one line, as the verbs say it
                found = run_lines(run.resolve(), args.windows, [f"config={args.config}", *args.set], Path(scratch), where)
            except TranslateError as error:
                parser.exit(1, f"average_windows.py: error: {error}\n")
            for line in found:
                print(json.dumps(line), flush=True)
            lines += found
    for line in summaries(lines):
        print(json.dumps(line), flush=True)
        lines.append(line)
    if args.output:
        args.output.write_text("".join(json.dumps(line) + "\n" for line in lines))


if __name__ == "__main__":
    main()
