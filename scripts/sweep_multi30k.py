#!/usr/bin/env python
"""The dev sweep that chooses config=multi30k: candidate recipes for Multi30k EN-DE on this
machine, each trained for the same minutes of a quiet machine, compared on the dev split only.

Minutes are turned into updates once per shape of candidate (a short quiet probe of its updates
per second, kept in <folder>/rates.json; candidates that differ in dropout or schedule alone share it), and
every run then trains for its updates: other load on
the machine (a second run beside it, tests) changes how long a run takes, never what it learns.
Each run validates ten times (dev loss and greedy dev BLEU on the whole dev split) and keeps its
last ten numbered checkpoints. Then, on the dev split alone (the test sets are never decoded
here), each run's averages of its last 1, 3, 5 and 10 checkpoints are decoded with beam 5 at
alpha 0.6; the best average is decoded with beam 4 too, the better of the two beams kept, and
`translate tune` chooses its alpha at that beam. What it chooses are candidates for a preset:
a preset's own figure is what `translate train`, `tune`, `decode` and `bleu` make of it.

    .venv/bin/python scripts/sweep_multi30k.py --minutes 60 --seeds 1 --parallel 2
    .venv/bin/python scripts/sweep_multi30k.py --minutes 60 --seeds 2 --candidates tiny-p0.2 tiny-p0.3
    .venv/bin/python scripts/sweep_multi30k.py --report            # the table, verdicts and figures only
    .venv/bin/python scripts/sweep_multi30k.py --evaluate RUN_DIR  # the same dev choice for one run trained apart

One JSON line per probe, per run, and per dev decode; then one per candidate (the mean and
standard deviation of its seeds' best dev BLEU), the table of runs (`translate table`), and
two figures in --folder: sweep.png, each candidate's dev BLEU with error bars over its seeds,
and curves.png, its training loss, dev perplexity and greedy dev BLEU (the mean of its seeds).
Runs that already hold their updates are not trained again, decodes already scored not redone.

The winner so far, "literature-fairseq-init" (docs/results.md: one seed per candidate at 60
minutes; "literature" first led tiny on a Zen 4 and "literature-linear" on a Zen 3, then fairseq's
init led "literature" on the Zen 3, and again over three seeds at 4 minutes' updates on a Zen 5),
is config=multi30k; tests/test_presets.py holds the two to the same model, optimizer,
initialization and batches. "literature-fairseq-init-lowercase" (the same on lowercased text) led it
on the goal's score, lowercased tokenized dev BLEU, by 1.18 on a Zen 4; config=multi30k stays
cased; config=multi30k_lowercase is the recipe for the literature's score.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional

from table3_mini import row_curves  # each candidate's curves, the mean of its seeds

from translate import figures
from translate.core.precision import cpu_model

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"

# The candidates: overrides of config=tiny (Multi30k EN-DE, 8k joint BPE, 4,096-token batches,
# warmup 400, averaging). "literature" is Wu et al. (2021)'s Transformer-Tiny recipe: 4+4 layers of
# d_model 128, FFN 256, 4 heads, dropout 0.3, Adam eps 1e-8, a peak rate of 0.005 after 2,000
# warmup updates (lr_scale = 0.005 / (128^-0.5 * 2000^-0.5)), clipping at 25, 8,192 tokens an update.
CANDIDATES: Dict[str, List[str]] = {
    "tiny": [],
    "tiny-p0.2": ["model.dropout=0.2"],
    "tiny-p0.3": ["model.dropout=0.3"],
    "literature": ["model.d_model=128", "model.d_ff=256", "model.heads=4", "model.layers=4", "model.dropout=0.3",
                   "optim.eps=1e-8", "optim.warmup_steps=2000", "optim.lr_scale=2.5298", "optim.clip_norm=25",
                   "train.tokens_per_update=8192"],
}
# The published recipe with its schedule fitted to a budget of updates: the same peak of 0.005,
# reached after 500 updates (lr_scale = 0.005 / (128^-0.5 * 500^-0.5)), then a straight line to
# zero at the run's last update. The published warmup (2,000 updates) is half of what an hour
# trains on a bf16 CPU, and more than an hour trains in fp32 on an AVX2 one.
CANDIDATES["literature-linear"] = [o for o in CANDIDATES["literature"] if not o.startswith(("optim.warmup_steps=", "optim.lr_scale="))] \
    + ["optim.warmup_steps=500", "optim.lr_scale=1.2649", "optim.decay=linear"]
# The published recipe with fairseq 0.12.2's initialization (train.init=fairseq), as the
# published model started: smaller Q, K, V and feed-forward weights than tensor2tensor's.
CANDIDATES["literature-fairseq-init"] = CANDIDATES["literature"] + ["train.init=fairseq"]
# config=multi30k trained on lowercased text (data.lowercase), as the published model was: the
# literature's score lowercases anyway, and lowercased text has fewer distinct words to learn.
CANDIDATES["literature-fairseq-init-lowercase"] = CANDIDATES["literature-fairseq-init"] + ["data.lowercase=true"]
# The same with the published warmup and peak, then a straight line to zero at the run's last
# update (optim.decay=linear): a budget of about 4,000 updates ends where the published schedule
# still has 71% of its peak, and averaging the last checkpoints only partly makes up for that.
CANDIDATES["literature-fairseq-init-lowercase-linear"] = CANDIDATES["literature-fairseq-init-lowercase"] + ["optim.decay=linear"]
# The same with a checkpoint at each epoch's end (about 58 updates on Multi30k) instead of at each
# tenth of the run, as fairseq saves and the published model averaged: the last 10 averaged are
# the last ~500 updates, where the decayed rate is lowest, instead of the whole run.
CANDIDATES["literature-fairseq-init-lowercase-linear-epochs"] = CANDIDATES["literature-fairseq-init-lowercase-linear"] + [
    "checkpoint.every_epochs=1"]
# Overrides that change what is learned but not the work an update does: candidates that differ
# only in these share one probe of updates per second.
RATE_NEUTRAL = ("model.dropout=", "optim.warmup_steps=", "optim.lr_scale=", "optim.decay=", "train.init=", "data.lowercase=",
                "checkpoint.every_epochs=")
AVERAGES = (1, 3, 5, 10)  # the last N numbered checkpoints averaged
# The error-bar figure's panels: each candidate's mean and standard deviation over its seeds.
SPREAD_MEASURES = {"dev_bleu_tuned": "dev BLEU, chosen beam, tuned alpha", "dev_bleu_beam5_alpha0.6": "dev BLEU, beam 5, alpha 0.6",
                   "greedy_dev_bleu_last": "greedy dev BLEU, last validation",
                   "dev_literature_bleu_tuned": "dev lowercased tokenized BLEU, chosen beam, tuned alpha"}
SPREADS_SIZE = figures.Size(450 * len(SPREAD_MEASURES), 600)  # pixels: room for each panel's title
PROBE_UPDATES = 150


def translate(*args: str, threads: Optional[int] = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return subprocess.run([sys.executable, "-m", "translate", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True, env=env)


def emit(record: Dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def record_of(run: Path) -> Dict[str, Any]:
    try:
        return json.loads((run / "run_record.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def common(name: str) -> List[str]:
    return ["config=tiny", f"data.path={MULTI30K}", *CANDIDATES[name]]


def data_of(run: Path) -> List[str]:
    """The data settings a run's dev decodes need besides config=tiny's: its references and the
    dev split the alpha is tuned on are lowercased where its training text was."""
    lowercase = record_of(run).get("settings", {}).get("data", {}).get("lowercase", False)
    return ["config=tiny", f"data.path={MULTI30K}", f"data.lowercase={str(lowercase).lower()}"]


def shape(name: str) -> str:
    """The candidates that compute alike (they differ in RATE_NEUTRAL overrides alone) share one
    probe: the first of them names it."""
    def work(candidate: str) -> List[str]:
        return sorted(o for o in CANDIDATES[candidate] if not o.startswith(RATE_NEUTRAL))
    return next(other for other in CANDIDATES if work(other) == work(name))


def probe(name: str, folder: Path) -> float:
    """Updates per second of a candidate's shape on this machine (2 threads, nothing else
    running): PROBE_UPDATES updates from the process start, from the run record."""
    rates_path = folder / "rates.json"
    rates = json.loads(rates_path.read_text()) if rates_path.is_file() else {}
    key = shape(name)
    if key not in rates:
        run = folder / f"probe-{key}"
        translate("train", *common(key), f"run_dir={run}", f"train.max_steps={PROBE_UPDATES}", "train.threads=2",
                  "checkpoint.every_steps=0", "valid.every_steps=0")
        training = record_of(run)["training"]
        rates[key] = training["updates"] / training["seconds"]
        rates_path.write_text(json.dumps(rates, indent=2) + "\n")
        emit({"probe": key, "updates_per_second": round(rates[key], 3), "cpu": cpu_model()})
    return rates[key]


def run_dir(folder: Path, name: str, seed: int) -> Path:
    return folder / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}-seed{seed}"


def train(name: str, seed: int, updates: int, folder: Path, threads: int) -> Path:
    where = run_dir(folder, name, seed)
    every = max(1, updates // 10)
    done = record_of(where).get("training", {}).get("updates") == updates
    started = time.monotonic()
    # A checkpoint at each tenth of the run, unless the candidate saves at its epochs' ends.
    saves = "checkpoint.every_steps=0" if any(o.startswith("checkpoint.every_epochs=") for o in CANDIDATES[name]) \
        else f"checkpoint.every_steps={every}"
    if not done:
        translate("train", *common(name), f"run_dir={where}", f"train.seed={seed}", f"train.max_steps={updates}",
                  f"train.threads={threads}", saves, "checkpoint.keep_last=10",
                  f"valid.every_steps={every}", "valid.bleu_sentences=1014", threads=threads)
    emit({"run": name, "seed": seed, "run_dir": str(where), "updates": updates, "trained_before": done,
          "minutes": round((time.monotonic() - started) / 60, 1)})
    return where


def dev_bleu(run: Path, average: int, beam: int, alpha: float, threads: int) -> Dict[str, Any]:
    """The dev split decoded with the average of the last `average` checkpoints, scored."""
    output = run / "sweep" / f"avg{average}-beam{beam}-alpha{alpha}.de"
    scored = output.with_suffix(".json")
    if not scored.is_file():
        data = data_of(run)
        translate("average", f"run_dir={run}", *data,
                  f"checkpoint.average_last={average}", threads=threads)
        checkpoint = run / "sweep" / f"avg{average}.pt"
        checkpoint.parent.mkdir(exist_ok=True)
        os.replace(run / "checkpoint_average.pt", checkpoint)
        translate("decode", *data, f"run_dir={run}", f"decode.checkpoint={checkpoint}",
                  "decode.split=validation", f"decode.beam_size={beam}", f"decode.length_penalty={alpha}",
                  f"decode.output={output}", threads=threads)
        report = json.loads(translate("bleu", *data, f"run_dir={run}",
                                      f"bleu.hyp={output}", f"bleu.ref={output}.ref", "bleu.format=json").stdout)
        scored.write_text(json.dumps({"sacrebleu": report["scores"]["sacrebleu"]["value"],
                                      "bp": float(re.search(r"BP = ([\d.]+)", report["scores"]["sacrebleu"]["text"]).group(1)),
                                      "literature": report["scores"]["lowercased_tokenized_bleu"]["value"]}))
    result = {"run_dir": str(run), "average": average, "beam": beam, "alpha": alpha, **json.loads(scored.read_text())}
    emit(result)
    return result


def best_average(found: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Of the averages' dev decodes at beam 5, alpha 0.6, the best sacreBLEU; a tie goes to the
    fewer checkpoints averaged (the first tried)."""
    return max(found, key=lambda r: r["sacrebleu"])


def best_beam(beam5: Dict[str, Any], beam4: Dict[str, Any]) -> int:
    """The beam the chosen average's alpha is tuned and decoded at: 4 where its dev BLEU beats
    beam 5's, else 5 (the preset's)."""
    return 4 if beam4["sacrebleu"] > beam5["sacrebleu"] else 5


def evaluate(run: Path, threads: int) -> Dict[str, Any]:
    """The run's best dev setting: the best average at beam 5, then the better of beams 5 and 4
    for it, then the alpha tune picks at that beam."""
    best = best_average([dev_bleu(run, n, 5, 0.6, threads) for n in AVERAGES])
    beam4 = dev_bleu(run, best["average"], 4, 0.6, threads)
    beam = best_beam(best, beam4)
    checkpoint = run / "sweep" / f"avg{best['average']}.pt"
    tuned = run / "sweep" / (f"tune-avg{best['average']}" + ("" if beam == 5 else f"-beam{beam}") + ".json")
    if not tuned.is_file():
        translate("tune", *data_of(run), f"run_dir={run}", f"decode.checkpoint={checkpoint}",
                  f"decode.beam_size={beam}", threads=threads)
        tuned.write_text(json.dumps(record_of(run)["length_penalty"]))
    tune = json.loads(tuned.read_text())
    top = max(tune["scores"], key=lambda s: s["sacrebleu"])
    # The goal's score (lowercased tokenized BLEU) at the chosen setting: it compares a lowercased
    # candidate with a cased one, whose sacreBLEU is against references of their own casing.
    literature = dev_bleu(run, best["average"], beam, tune["alpha"], threads)["literature"]
    result = {"run_dir": str(run), "best_average": best["average"], "dev_bleu_beam5_alpha0.6": best["sacrebleu"],
              "dev_bleu_beam4_alpha0.6": beam4["sacrebleu"], "best_beam": beam, "tuned_alpha": tune["alpha"],
              "dev_bleu_tuned": top["sacrebleu"], "bp_tuned": top["bp"],
              "dev_literature_bleu_tuned": literature,
              "greedy_dev_bleu_last": record_of(run).get("valid", {}).get("bleu")}
    emit(result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60, help="quiet-machine minutes each run is worth")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    parser.add_argument("--folder", default="runs/sweep-multi30k")
    parser.add_argument("--parallel", type=int, default=1, help="runs trained at once (threads: 2 / parallel each)")
    parser.add_argument("--report", action="store_true", help="only evaluate and report what is trained")
    parser.add_argument("--evaluate", metavar="RUN_DIR",
                        help="only choose one trained run's average, beam and alpha on dev, by the same rule")
    args = parser.parse_args()
    if args.evaluate:
        evaluate(Path(args.evaluate), threads=2)
        return
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    rates = {name: probe(name, folder) for name in args.candidates}  # alone, before any run
    updates = {name: int(rates[name] * args.minutes * 60) for name in args.candidates}
    threads = max(1, 2 // args.parallel)
    jobs = [(name, seed) for seed in args.seeds for name in args.candidates]
    if args.report:
        runs = [run_dir(folder, name, seed) for name, seed in jobs]
    else:
        with ThreadPoolExecutor(args.parallel) as pool:
            runs = list(pool.map(lambda job: train(job[0], job[1], updates[job[0]], folder, threads), jobs))
    with ThreadPoolExecutor(args.parallel) as pool:
        results = dict(zip(jobs, pool.map(lambda run: evaluate(run, threads), runs)))
    spreads: Dict[str, List["figures.Spread"]] = {measure: [] for measure in SPREAD_MEASURES}
    for name in args.candidates:
        scores = [results[(name, seed)]["dev_bleu_tuned"] for seed in args.seeds]
        emit({"candidate": name, "overrides": CANDIDATES[name], "updates": updates[name], "minutes": args.minutes,
              "seeds": args.seeds, "dev_bleu_tuned_mean": round(statistics.mean(scores), 2),
              "dev_bleu_tuned_std": round(statistics.stdev(scores), 2) if len(scores) > 1 else None})
        for measure in SPREAD_MEASURES:
            found = [results[(name, seed)][measure] for seed in args.seeds]
            spreads[measure].append(figures.Spread(name, statistics.mean(found),
                                                   statistics.stdev(found) if len(found) > 1 else None))
    print(translate("table", f"table.runs=[{','.join(str(r) for r in runs)}]").stdout)
    title = f"Multi30k EN-DE dev, {args.minutes:g} minutes' updates each on {cpu_model()}, seeds {args.seeds}"
    figure = figures.spreads([(label, spreads[measure]) for measure, label in SPREAD_MEASURES.items()],
                             folder / "sweep.png", title, SPREADS_SIZE)
    figures.write_json(figure.with_suffix(".json"), {"title": title, "results": [
        {"candidate": name, "seed": seed, **result} for (name, seed), result in results.items()]})
    by_candidate = {name: [run_dir(folder, name, seed) for seed in args.seeds] for name in args.candidates}
    emit({"figures": [str(figure), str(row_curves(by_candidate, folder / "curves.png", title))]})


if __name__ == "__main__":
    main()
