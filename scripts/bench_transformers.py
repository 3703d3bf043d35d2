#!/usr/bin/env python
"""The transformers export on the CPU: one JSON line per measurement.

On one checkpoint (default: make demo's, the one decode would use in --run-dir):
  - export_in_process: `translate export export.format=transformers` as export() in this
    process (transformers already imported; its import is timed on its own line),
  - export_cli_process: the same as a whole `python -m translate export` process, start-up included,
  - greedy_ours / greedy_transformers: greedy decoding of the same sentences (default: the
    Multi30k test split) by ours (decode.beam_size=1) and by the exported MarianMTModel's
    generate(num_beams=1), at the same output cap (max_len_a * source length + max_len_b),
    in this process on the same torch threads, interleaved for --rounds rounds (models loaded
    once, before the first round),
  - greedy_summary: the best round of each, their ratio and the fraction of identical outputs.
Each greedy line has sacreBLEU on the dev split only (--split validation): a held-out test split is
decoded for speed, never scored here (bleu is null).

    make demo    # trains runs/tiny-multi30k_en_de/checkpoint_last.pt first
    .venv/bin/python scripts/bench_transformers.py --threads 2 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, List

import torch


from translate import averaging
from translate.data.loading import load_corpus
from translate.hydra_cli import load_config
from translate.metrics import corpus_bleu
from translate.translator import Translator

ROOT = Path(__file__).resolve().parents[1]

DEMO_RUN = ROOT / "runs" / "tiny-multi30k_en_de"


def emit(**record) -> None:
    print(json.dumps(record), flush=True)


def timed(work: Callable[[], object]):
    """(work's result, its wall seconds)."""
    started = time.perf_counter()
    result = work()
    return result, time.perf_counter() - started


def find_checkpoint(overrides: List[str]) -> Path:
    """The checkpoint decode would use; without one, exit naming what to run."""
    cfg = load_config("decode", overrides)
    source = averaging.chosen_checkpoint(cfg)
    if not source.is_file():
        sys.exit(f"no checkpoint in {cfg.run_dir}: run `make demo` (15 minutes), or a short one: "
                 f"`.venv/bin/translate train config=tiny train.max_steps=300 run_dir={cfg.run_dir}`, then --run-dir {cfg.run_dir}")
    return source


def import_transformers() -> None:
    from transformers import MarianMTModel  # noqa: F401  (loads the Marian modules too)


def bench_export(overrides: List[str], source: Path, folder: Path) -> None:
    """The export step in this process, then as a whole CLI process (into a second folder)."""
    from translate.verbs.export import export

    _, seconds = timed(import_transformers)  # the import alone, outside the export
    emit(measurement="import_transformers", seconds=round(seconds, 2))
    export_overrides = [*overrides, "export.format=transformers", f"export.checkpoint={source}"]
    _, seconds = timed(lambda: export(load_config("export", [*export_overrides, f"export.output={folder}"])))
    emit(measurement="export_in_process", seconds=round(seconds, 2), checkpoint=str(source))
    command = [sys.executable, "-m", "translate", "export", *export_overrides, f"export.output={folder}-cli"]
    _, seconds = timed(lambda: subprocess.run(command, check=True, cwd=ROOT, capture_output=True))
    emit(measurement="export_cli_process", seconds=round(seconds, 2))


def greedy_record(name: str, round_: int, hypotheses: List[str], references: List[str], seconds: float, **extra) -> dict:
    """One system's round; sacreBLEU only where references are given (the dev split: see bench_greedy)."""
    bleu = round(corpus_bleu(hypotheses, references)[0].score, 2) if references else None
    record = dict(measurement=f"greedy_{name}", round=round_, sentences=len(hypotheses), seconds=round(seconds, 2),
                  sentences_per_s=round(len(hypotheses) / seconds, 1), bleu=bleu,
                  threads=torch.get_num_threads(), **extra)
    emit(**record)
    return record


def bench_greedy(overrides: List[str], source: Path, folder: Path, args) -> None:
    """Ours and transformers' greedy search on the same sentences, alternating for args.rounds rounds."""
    from translate.formats.transformers import TransformersTranslator

    cfg = load_config("decode", overrides)
    sources, references = load_corpus(cfg.data, args.split).pairs()
    if args.limit:
        sources, references = sources[: args.limit], references[: args.limit]
    if args.split != cfg.data.valid_split:
        references = []  # a held-out split: decoded for speed, never scored here (issue 52)
    d = replace(cfg.decode, beam_size=1)
    ours, theirs = Translator.from_checkpoint(source), TransformersTranslator(folder)
    systems = {
        "ours": (lambda: ours.translate(sources, d), dict(tokens_per_batch=d.tokens_per_batch)),
        "transformers": (lambda: theirs.translate(sources, d, batch_size=args.batch_size), dict(batch_size=args.batch_size)),
    }
    best, outputs = {}, {}
    for round_ in range(1, args.rounds + 1):
        for name, (translate, extra) in systems.items():
            outputs[name], seconds = timed(translate)
            record = greedy_record(name, round_, outputs[name], references, seconds, **extra)
            best[name] = max(best.get(name, 0.0), record["sentences_per_s"])
    same = sum(a == b for a, b in zip(outputs["ours"], outputs["transformers"]))
    emit(measurement="greedy_summary", sentences=len(sources), rounds=args.rounds, ours_sentences_per_s=best["ours"],
         transformers_sentences_per_s=best["transformers"], transformers_over_ours=round(best["transformers"] / best["ours"], 2),
         identical=round(same / len(sources), 4), max_len=f"{d.max_len_a} * source + {d.max_len_b}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", default=str(DEMO_RUN), help="run whose checkpoint is exported and decoded")
    parser.add_argument("--config", default="tiny", help="preset whose data and decode settings are used")
    parser.add_argument("--override", nargs="*", default=[], help="more config overrides (after --run-dir's)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int, default=0, help="first N sentences only (0: all)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, for both")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of ours and transformers")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per generate() call")
    args = parser.parse_args()
    if args.rounds < 1 or args.threads < 1:
        parser.error("--rounds and --threads must be at least 1")
    torch.set_num_threads(args.threads)

    overrides = [f"config={args.config}", f"run_dir={args.run_dir}", *args.override]
    source = find_checkpoint(overrides)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "hf"
        bench_export(overrides, source, folder)
        bench_greedy(overrides, source, folder, args)


if __name__ == "__main__":
    main()
