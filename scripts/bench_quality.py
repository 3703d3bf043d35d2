#!/usr/bin/env python
"""Time to quality against fairseq 0.12.2: dev BLEU against minutes and against updates, one
JSON line per checkpoint, a summary, and both curves as a PNG beside the JSON.

One trainer after the other on this machine, the same minutes each (default 17), the same
model size (tiny: 3+3 layers, 256/1024, 4 heads, dropout 0.1), data (Multi30k EN-DE, 8k joint
vocabulary), batch budget (4,096 tokens) and threads. Each recipe is its own: fairseq's
`run.sh curve` (lr 7e-4, warmup 400) and our config=tiny. Each keeps a checkpoint every
--every updates; every checkpoint is decoded on the dev split (beam 4, length penalty 0.6:
fairseq's --lenpen, our GNMT alpha) and scored with sacreBLEU. Seconds count from the start of
each trainer's process, since start-up is part of a user's wait. Several of our precisions
(--ours fp32,bf16) run one after the other, as trainers of their own. fairseq comes from
../shared/anchors/fairseq; where it is not built, its side is skipped with a line saying so.

    .venv/bin/python scripts/bench_quality.py                       # 17 minutes each
    .venv/bin/python scripts/bench_quality.py --minutes 15 --ours fp32,bf16 --out runs/quality
    .venv/bin/python scripts/bench_quality.py --minutes 1 --every 20 --no-fairseq   # a quick check
    .venv/bin/python scripts/bench_quality.py --score runs/bench_quality/ours-fp32   # score a finished run again
    .venv/bin/python scripts/bench_quality.py --minutes 15 --ours fp32 --no-fairseq \
        --recipe "tiny: config=tiny" "tiny-fairseq-init: config=tiny train.init=fairseq" "multi30k: config=multi30k"

--recipe sets our side's presets and overrides, one trainer each ("LABEL: overrides", trained one
after the other, named ours-LABEL-PRECISION): which recipe make demo should train decides here.
Without it ours is config=tiny, named ours-PRECISION.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from bench_fairseq import ANCHOR, NOT_BUILT, ROOT, anchor_built, emit, threads_env

# Imported before any training, so that the scoring runs the code the run started with.
import sacrebleu
import torch

from translate.core import paths
from translate.core.config import DecodeConfig
from translate.core.precision import cpu_model
from translate.data.loading import load_corpus
from translate.hydra_cli import load_config
from translate.translator import Translator


@dataclass
class Curve:
    """One trainer's checkpoints: (updates, seconds since its process started, BLEU, BP)."""

    trainer: str
    points: List[Dict[str, float]] = field(default_factory=list)

    def final(self) -> Dict[str, float]:
        return self.points[-1]

    def seconds_to(self, bleu: float) -> Optional[float]:
        """When this trainer first reached `bleu`, interpolated between checkpoints; None if never."""
        previous = {"seconds": 0.0, "bleu": 0.0}
        for point in self.points:
            if point["bleu"] >= bleu:
                rise = point["bleu"] - previous["bleu"]
                share = (bleu - previous["bleu"]) / rise if rise > 0 else 1.0
                return previous["seconds"] + share * (point["seconds"] - previous["seconds"])
            previous = point
        return None

    def at_minutes(self, minutes: float) -> Optional[float]:
        """The BLEU of the last checkpoint written by then (what a user stopping then has)."""
        done = [p["bleu"] for p in self.points if p["seconds"] <= minutes * 60]
        return done[-1] if done else None


def fairseq_curve(minutes: float, every: int, threads: int) -> Optional[Curve]:
    """run.sh curve: fairseq-train for `minutes`, then each checkpoint scored on the dev split
    (run.sh reports sacreBLEU alone, so fairseq's brevity penalty is null)."""
    if not anchor_built():
        print(NOT_BUILT + " (fairseq's side skipped)", file=sys.stderr)
        return None
    result = subprocess.run(["bash", str(ANCHOR / "run.sh"), "curve", str(minutes), str(every)], capture_output=True,
                            text=True, env=threads_env(threads), check=True)
    curve = Curve("fairseq")
    for line in result.stdout.splitlines():
        row = json.loads(line)
        curve.points.append({"updates": row["updates"], "seconds": row["seconds"], "bleu": row["sacrebleu"], "bp": None})
    return report(curve)


@dataclass(frozen=True)
class Recipe:
    """One of our trainers: a label and the overrides it trains with."""

    label: Optional[str]  # None: the default, config=tiny, named by its precision alone
    overrides: List[str]

    @classmethod
    def parse(cls, text: str) -> "Recipe":
        label, colon, overrides = text.partition(":")
        if not colon or not label.strip() or not overrides.split():
            raise SystemExit(f"--recipe {text!r}: expected 'LABEL: override override ...'")
        return cls(label.strip(), overrides.split())

    def trainer(self, precision: str) -> str:
        return f"ours-{precision}" if self.label is None else f"ours-{self.label}-{precision}"


DEFAULT_RECIPE = Recipe(None, ["config=tiny"])


def our_training(recipe: Recipe, precision: str, minutes: float, every: int, threads: int, run_dir: Path) -> float:
    """`translate train` of a recipe for `minutes`, a checkpoint every `every` updates, all kept;
    returns the time its process started (checkpoint times count from it)."""
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    command = [sys.executable, "-m", "translate", "train", *recipe.overrides, f"train.precision={precision}",
               f"train.max_minutes={minutes}", f"train.threads={threads}", f"checkpoint.every_steps={every}",
               "checkpoint.every_minutes=null", "checkpoint.keep_last=100000", "valid.every_steps=0",
               f"run_dir={run_dir}"]
    started = time.time()
    subprocess.run(command, cwd=ROOT, env=threads_env(threads), check=True, capture_output=True, text=True)
    return started


def our_curve(recipe: Recipe, precision: str, minutes: float, every: int, threads: int, folder: Path) -> Curve:
    """Our training, then each numbered checkpoint decoded on the dev split and scored."""
    trainer = recipe.trainer(precision)
    run_dir = folder / trainer
    started = our_training(recipe, precision, minutes, every, threads, run_dir)
    (run_dir / STARTED).write_text(json.dumps({"unix_seconds": started}) + "\n")
    return scored(run_dir, trainer, threads)


# Variables that force a CPU's code paths down (an AVX2 CPU's, seen on an AVX-512 one): kept with the figures.
ISA_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "CT2_FORCE_CPU_ISA")
STARTED = "process_started.json"  # when our trainer's process started, beside its checkpoints


def scored(run_dir: Path, trainer: str, threads: int) -> Curve:
    """Each numbered checkpoint of a run of ours decoded on the dev split (beam 4, alpha 0.6)
    and scored; seconds from the process start where STARTED records it (else null)."""
    started = json.loads((run_dir / STARTED).read_text())["unix_seconds"] if (run_dir / STARTED).is_file() else None
    torch.set_num_threads(threads)
    cfg = load_config("decode", ["config=tiny", f"run_dir={run_dir}"])
    sources, references = load_corpus(cfg.data, cfg.data.valid_split).pairs()
    settings = DecodeConfig(beam_size=4, length_penalty=0.6)
    curve = Curve(trainer)
    for checkpoint in paths.numbered_checkpoints(run_dir):
        bleu = sacrebleu.corpus_bleu(Translator.from_checkpoint(checkpoint).translate(sources, settings), [references])
        seconds = round(checkpoint.stat().st_mtime - started, 1) if started is not None else None
        curve.points.append({"updates": int(checkpoint.stem.split("_")[1]), "seconds": seconds,
                             "bleu": round(bleu.score, 2), "bp": round(bleu.bp, 4)})
    return report(curve)


def report(curve: Curve) -> Curve:
    """Print a trainer's lines as soon as its curve is complete."""
    for point in curve.points:
        emit(measurement="time_to_quality", trainer=curve.trainer, **point)
    return curve


def summary(curves: List[Curve]) -> Dict[str, object]:
    """Each trainer against the first (the reference): minutes to the other's final BLEU, BLEU
    at the updates both reached, and BLEU at equal minutes."""
    reference, *others = curves
    rows = []
    for other in others:
        goal = reference.final()["bleu"]
        reached = other.seconds_to(goal)
        by_updates = {p["updates"]: p["bleu"] for p in reference.points}
        rows.append({
            "trainer": other.trainer, "against": reference.trainer,
            f"{reference.trainer}_final_bleu": goal, f"{reference.trainer}_minutes_to_final": round(reference.final()["seconds"] / 60, 2),
            f"{other.trainer}_minutes_to_it": round(reached / 60, 2) if reached is not None else None,
            "time_to_quality_ratio": round(reference.final()["seconds"] / reached, 3) if reached else None,
            f"{other.trainer}_final_bleu": other.final()["bleu"],
            f"minutes_{reference.trainer}_needs_for_{other.trainer}_final": _minutes(reference.seconds_to(other.final()["bleu"])),
            "bleu_at_equal_updates": [{"updates": p["updates"], reference.trainer: by_updates[p["updates"]], other.trainer: p["bleu"]}
                                      for p in other.points if p["updates"] in by_updates],
            "bleu_at_equal_minutes": [{"minutes": m, reference.trainer: reference.at_minutes(m), other.trainer: other.at_minutes(m)}
                                      for m in _minute_grid(reference, other)],
        })
    return {"measurement": "time_to_quality_summary", "rows": rows}


def _minutes(seconds: Optional[float]) -> Optional[float]:
    return round(seconds / 60, 2) if seconds is not None else None


def _minute_grid(*curves: Curve) -> List[float]:
    last = min(c.final()["seconds"] for c in curves) / 60
    return [m for m in (1, 2, 3, 5, 7.5, 10, 12.5, 15, 17, 20, 25, 30) if m <= last + 1e-9]


def draw(curves: List[Curve], path: Path) -> Optional[Path]:
    """BLEU against minutes and against updates, one line per trainer (translate.verbs.plot)."""
    try:
        from translate import figures
        from translate.core.errors import TranslateError

        series = lambda x: [figures.Series(c.trainer, [p[x] / (60 if x == "seconds" else 1) for p in c.points],
                                        [p["bleu"] for p in c.points]) for c in curves]
        panels = [figures.Panel("minutes since the process started", "dev sacreBLEU (beam 4)", series("seconds")),
                  figures.Panel("updates", "dev sacreBLEU (beam 4)", series("updates"))]
        return figures.curve_panels(panels, path, title="Time to quality: Multi30k EN-DE dev",
                                 size=figures.Size(1600, 700))
    except TranslateError as error:  # matplotlib not installed: the JSON lines still stand
        print(f"no PNG: {error}", file=sys.stderr)
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=17.0, help="training minutes of each trainer")
    parser.add_argument("--every", type=int, default=100, help="updates between checkpoints")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ours", default="auto", help="our precisions, comma-separated (fp32, bf16, auto)")
    parser.add_argument("--no-fairseq", action="store_true", help="our side only")
    parser.add_argument("--recipe", type=Recipe.parse, nargs="+", default=[DEFAULT_RECIPE],
                        help="our trainers: 'LABEL: overrides' each (default: config=tiny)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_quality", help="runs, JSON lines and PNG")
    parser.add_argument("--score", type=Path, nargs="*", default=[],
                        help="only score these finished runs of ours (their checkpoints on the dev split), no training")
    args = parser.parse_args()
    if args.score:
        for run_dir in args.score:
            scored(run_dir, run_dir.name, args.threads)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    ours = [(recipe, precision) for recipe in args.recipe for precision in args.ours.split(",")]
    emit(measurement="machine", cpu=cpu_model(), threads=args.threads, minutes=args.minutes, every=args.every,
         ours={recipe.trainer(precision): recipe.overrides for recipe, precision in ours},
         isa={k: os.environ[k] for k in ISA_VARIABLES if k in os.environ})
    curves = [] if args.no_fairseq else [c for c in [fairseq_curve(args.minutes, args.every, args.threads)] if c]
    curves += [our_curve(recipe, precision, args.minutes, args.every, args.threads, args.out) for recipe, precision in ours]
    for empty in [c for c in curves if not c.points]:
        print(f"{empty.trainer}: no checkpoint in {args.minutes} minutes (--every {args.every}); left out", file=sys.stderr)
    curves = [c for c in curves if c.points]
    with (args.out / "curves.jsonl").open("w") as lines:
        for curve in curves:
            for point in curve.points:
                lines.write(json.dumps({"measurement": "time_to_quality", "trainer": curve.trainer, **point}) + "\n")
        if len(curves) > 1:
            row = summary(curves)
            emit(**row)
            lines.write(json.dumps(row) + "\n")
    drawn = draw(curves, args.out / "curves.png")
    if drawn:
        print(f"curves: {drawn}", file=sys.stderr)


if __name__ == "__main__":
    main()
