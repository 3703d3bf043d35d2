#!/usr/bin/env python
"""A published number on this machine: Multi30k EN-DE test2016, lowercased tokenized BLEU (Wu et
al. 2021's text-only Transformer-Tiny: 41.02), ours against fairseq 0.12.2 running that paper's
recipe, the same minutes each, one after the other on this machine (nothing else running).

- ours: `translate train config=PRESET train.max_minutes=M` (--preset: config=multi30k, the recipe
  scripts/sweep_multi30k.py chose on the dev split), then `translate tune` (alpha on the dev split),
  then `translate decode` of each test set;
- fairseq: `../shared/anchors/fairseq/run.sh literature M` (the published recipe: the last 10
  epoch checkpoints averaged, beam 5, test2016), then the same average's beam-5 translations of
  test2017 and mscoco2017 (fairseq-interactive, the anchor's sentencepiece model).

Every translation is scored here by translate.metrics, as the literature scores it (lowercased,
Moses-tokenized, BLEU on tokens) and as sacreBLEU does (cased, 13a), against the raw references
both trainers are held to; ours is also scored by `translate bleu`, whose run record keeps it. One JSON line per trainer
and test set, then a summary line per trainer; the test sets are decoded once, at the end.

    .venv/bin/python scripts/bench_multi30k.py --minutes 60             # ours, then fairseq: about 2.5 hours
    .venv/bin/python scripts/bench_multi30k.py --minutes 60 --no-fairseq
    .venv/bin/python scripts/bench_multi30k.py --score-only --folder runs/bench-multi30k   # score again
    (--score-only also finishes a fairseq run that trained but stopped before its average)
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

from bench_fairseq import ANCHOR, NOT_BUILT, ROOT, anchor_built, emit
from fairseq_average_checkpoints import EPOCH_CHECKPOINT

from translate.core.precision import cpu_model
from translate.metrics import corpus_bleu, lowercased_tokenized_bleu

RAW = ROOT.parent / "shared" / "data" / "raw" / "multi30k-task1-raw"
# Our split names and the raw files of the same test sets (what fairseq translates).
TESTS = {"test": "test_2016_flickr", "test_2017_flickr": "test_2017_flickr", "test_2017_mscoco": "test_2017_mscoco"}
HERE = Path(__file__).resolve().parent
PUBLISHED = 41.02  # Wu et al. (2021), test2016, lowercased tokenized BLEU


def raw_lines(name: str, lang: str) -> List[str]:
    with gzip.open(RAW / f"{name}.{lang}.gz", "rt", encoding="utf-8") as file:
        return file.read().splitlines()


def scores(hypotheses: List[str], references: List[str]) -> Dict[str, float]:
    """The literature's score, cased sacreBLEU and its brevity penalty, and sacreBLEU -lc (what a
    model of lowercased text, data.lowercase, can be held to besides the literature's)."""
    lowercased, _ = lowercased_tokenized_bleu(hypotheses, references, "de")
    sacre, _ = corpus_bleu(hypotheses, references)
    sacre_lc, _ = corpus_bleu(hypotheses, references, lowercase=True)
    return {"lowercased_tokenized_bleu": round(lowercased.score, 2), "sacrebleu": round(sacre.score, 2),
            "bp": round(sacre.bp, 3), "sacrebleu_lowercased": round(sacre_lc.score, 2)}


def translate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "translate", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True)


def ours(folder: Path, minutes: float, preset: str, train: bool, overrides: List[str]) -> None:
    run_dir = folder / "ours"
    run = [f"config={preset}", f"run_dir={run_dir}"]
    common = [*run, *overrides]
    # The time limit, then the overrides (which win: train.max_steps among them stops the run earlier).
    limits = [*run, f"train.max_minutes={minutes}", f"train.max_steps={10**9}", *overrides]
    started = time.monotonic()
    if train:
        translate("train", *limits)
    trained = time.monotonic() - started
    translate("tune", *common)  # alpha on the dev split; decode then uses it
    record = json.loads((run_dir / "run_record.json").read_text())
    results = {}
    for split, name in TESTS.items():
        output = run_dir / "decode" / f"{split}.de"
        translate("decode", *common, f"decode.split={split}", f"decode.output={output}")
        translate("bleu", *common, f"bleu.hyp={output}", f"bleu.ref={output}.ref")  # the run's record keeps the scoring
        results[split] = scores(output.read_text(encoding="utf-8").splitlines(), raw_lines(name, "de"))
        emit(measurement="multi30k_test", trainer="ours", split=name, **results[split])
    training = record["training"]
    emit(measurement="multi30k_summary", trainer="ours", command=f"translate train {' '.join(limits)}",
         updates=training["updates"], training_minutes=round(training["seconds"] / 60, 1),
         wall_minutes_this_run=round(trained / 60, 1) if train else None, precision=training["precision"],
         alpha=record.get("length_penalty", {}).get("alpha"), test2016_lowercased_tokenized_bleu=results["test"][
             "lowercased_tokenized_bleu"], published=PUBLISHED)


def fairseq(folder: Path, minutes: float, train: bool, checkpoint: str = "average.pt") -> None:
    anchor_out = folder / "fairseq"
    env = dict(os.environ, OUT=str(anchor_out))
    a = Path(os.environ.get("FAIRSEQ_ANCHOR", "/tmp/fairseq-anchor"))
    averager = a / "src" / "fairseq-0.12.2" / "scripts" / "average_checkpoints.py"
    if not averager.is_file():  # the PyPI sdist has no scripts/: run.sh literature stopped there
        averager.parent.mkdir(exist_ok=True)
        shutil.copyfile(HERE / "fairseq_average_checkpoints.py", averager)
    if train:
        result = subprocess.run(["bash", str(ANCHOR / "run.sh"), "literature", str(minutes)], env=env,
                                capture_output=True, text=True, check=True)
        (folder / "fairseq_literature.json").write_text(result.stdout.strip().splitlines()[-1] + "\n")
    summary_file = folder / "fairseq_literature.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else finish_fairseq(a, anchor_out)
    prefix = "" if checkpoint == "average.pt" else f"{Path(checkpoint).stem}_"  # translations of another checkpoint apart
    for split, name in TESTS.items():
        hypotheses = fairseq_translate(a, anchor_out / "literature" / checkpoint, raw_lines(name, "en"),
                                       anchor_out / f"{prefix}{name}.de")
        emit(measurement="multi30k_test", trainer="fairseq", split=name, checkpoint=checkpoint,
             **scores(hypotheses, raw_lines(name, "de")))
    emit(measurement="multi30k_summary", trainer="fairseq", command=f"run.sh literature {minutes}",
         updates=summary["updates"], training_minutes=round(summary["training_seconds"] / 60, 1),
         epochs_averaged=summary["epochs_averaged"], run_sh_lowercased_tokenized_bleu=summary["lowercased_tokenized_bleu"],
         run_sh_sacrebleu=summary["sacrebleu"], published=PUBLISHED)


def finish_fairseq(anchor: Path, anchor_out: Path) -> dict:
    """What run.sh literature would have printed, for a run that trained but stopped before its
    average (its updates and seconds read from fairseq's log); the average made here as run.sh makes it."""
    log = (anchor_out / "literature.log").read_text(encoding="utf-8")
    saved = anchor_out / "literature"
    epochs = min(10, sum(1 for p in saved.iterdir() if EPOCH_CHECKPOINT.match(p.name)))
    if not (saved / "average.pt").is_file():
        subprocess.run([str(anchor / "venv" / "bin" / "python"), str(HERE / "fairseq_average_checkpoints.py"),
                        "--inputs", str(saved), "--num-epoch-checkpoints", str(epochs), "--output",
                        str(saved / "average.pt")], check=True, capture_output=True, text=True)
    return {"updates": int(re.findall(r"num_updates[ =](\d+)", log)[-1]),
            "training_seconds": float(re.findall(r"done training in ([\d.]+) seconds", log)[-1]),
            "epochs_averaged": epochs, "lowercased_tokenized_bleu": None, "sacrebleu": None}


def fairseq_translate(anchor: Path, checkpoint: Path, sources: List[str], output: Path) -> List[str]:
    """fairseq-interactive with the averaged checkpoint, beam 5 (as run.sh literature), the
    sources encoded with the anchor's sentencepiece model; the translations in input order."""
    if output.is_file():
        return output.read_text(encoding="utf-8").splitlines()
    python = anchor / "venv" / "bin" / "python"
    encode = ("import sys, sentencepiece as spm; sp = spm.SentencePieceProcessor(model_file=sys.argv[1]); "
              "[print(' '.join(sp.encode(l.strip(), out_type=str))) for l in sys.stdin]")
    pieces = subprocess.run([str(python), "-c", encode, str(anchor / "data" / "spm" / "spm_bpe8000.model")],
                            input="\n".join(sources) + "\n", capture_output=True, text=True, check=True).stdout
    generated = subprocess.run(
        [str(anchor / "venv" / "bin" / "fairseq-interactive"), str(anchor / "data" / "data-bin"), "--cpu", "--path",
         str(checkpoint), "--source-lang", "en", "--target-lang", "de", "--beam", "5", "--buffer-size", "256",
         "--batch-size", "64", "--remove-bpe", "sentencepiece"],
        input=pieces, capture_output=True, text=True, check=True,
        env=dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", PYTHONWARNINGS="ignore")).stdout
    found = {int(m.group(1)): m.group(2) for m in re.finditer(r"^D-(\d+)\t[^\t]*\t(.*)$", generated, re.M)}
    hypotheses = [found.get(i, "") for i in range(len(sources))]
    output.write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    return hypotheses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--preset", default="multi30k", help="our config= preset")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides of ours, after the preset")
    parser.add_argument("--folder", default="runs/bench-multi30k")
    parser.add_argument("--no-fairseq", dest="with_fairseq", action="store_false")
    parser.add_argument("--no-ours", dest="with_ours", action="store_false")
    parser.add_argument("--score-only", action="store_true", help="decode and score what is trained, train nothing")
    parser.add_argument("--fairseq-checkpoint", default="average.pt", help="which of fairseq's checkpoints to score (run.sh's: average.pt)")
    args = parser.parse_args()
    folder = Path(args.folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    emit(measurement="machine", cpu=cpu_model(), date=time.strftime("%Y-%m-%d %H:%M"))
    if args.with_ours:
        ours(folder, args.minutes, args.preset, train=not args.score_only, overrides=args.set)
    if args.with_fairseq:
        if anchor_built():
            fairseq(folder, args.minutes, train=not args.score_only, checkpoint=args.fairseq_checkpoint)
        else:
            emit(measurement="multi30k_summary", trainer="fairseq", skipped=NOT_BUILT)


if __name__ == "__main__":
    main()
