#!/usr/bin/env python
"""Behaviour and speed of this tree against another revision's, side by side: one JSON line per
measurement. For a change that must not change behaviour (a redesign, a clean-up).

The other revision is checked out into a temporary git worktree and run with this venv (its
`python -m translate` imports the tree it runs in). Measured:
- `same_training`: 14 updates of a small model on Multi30k's dev split, one thread, with two
  validations (dev loss and greedy BLEU): every tensor and value of checkpoint_last.pt
  (weights, Adam's moments and step counts, schedule, random states, data position) equal;
- `same_resume`: the other tree's checkpoint at update 7 resumed by this tree to 14 equals the
  other tree's uninterrupted 14;
- `same_outputs`: that checkpoint decoded (beam 4, greedy, 4-best lists, sampling; Multi30k
  test), exported to CTranslate2 and to transformers (the model card too), and tune's scores
  of each alpha on 100 dev sentences, by both trees: identical files;
- `throughput` (--rounds N): the tiny model's whole `translate train` loop, target tokens/s as
  scripts/bench_fairseq.py measures ours, the two trees interleaved, and their ratio per round.

With --preset NAME --minutes M, only the speed of that preset as users train it: `translate train
config=NAME train.max_minutes=M` in each tree (its checkpoints, validation and schedule, as the
hour runs them), the trees alternating in the order base, this, this, base, ... so that a drift
of the machine's speed falls on both; per run (`preset_run`) the updates reached, target tokens/s
and the MFU the log prints, and per round (`preset_round`) the ratio of updates. With --set, this
tree's runs take those overrides too: `--base HEAD --set data.vocab_size=4000` measures a setting.

    .venv/bin/python scripts/compare_trees.py --base HEAD~3 --rounds 3
    .venv/bin/python scripts/compare_trees.py --base ff71cc0 --preset multi30k_lowercase --minutes 5 --rounds 2
    .venv/bin/python scripts/compare_trees.py --base HEAD --preset multi30k_lowercase --set data.vocab_size=4000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import bench_fairseq

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"

SMALL = ["config=tiny", f"data.path={MULTI30K}", "data.train_split=validation", "data.vocab_size=603",
         "model.d_model=64", "model.d_ff=128", "model.heads=4", "model.layers=2", "optim.warmup_steps=10",
         "train.tokens_per_batch=1500", "train.tokens_per_update=3000", "train.max_steps=14", "train.log_every=7",
         "checkpoint.every_steps=7", "valid.every_steps=7", "valid.bleu_sentences=20", "train.threads=1"]


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def translate(tree: Path, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "translate", *args], cwd=tree, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"translate {args[0]} failed in {tree}:\n{result.stderr[-3000:]}")
    return result


def flat(value: Any, prefix: str = "") -> Iterator[Tuple[str, Any]]:
    """(dotted name, leaf) of a checkpoint's nested dicts and lists."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from flat(item, f"{prefix}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from flat(item, f"{prefix}[{index}]")
    else:
        yield prefix, value


def differences(a: Path, b: Path) -> List[str]:
    """The leaves of two checkpoints that differ (the settings aside: they name other paths)."""
    import torch

    left, right = (dict(flat(torch.load(p, weights_only=True))) for p in (a, b))
    names = sorted(n for n in set(left) | set(right) if not n.startswith(".config"))
    same = lambda x, y: (torch.equal(x, y) and x.dtype == y.dtype) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) else x == y  # noqa: E731
    return [n for n in names if n not in left or n not in right or not same(left[n], right[n])]


def same_training(base: Path, folder: Path) -> Path:
    runs = {}
    for name, tree in (("base", base), ("this", ROOT)):
        runs[name] = folder / name
        translate(tree, "train", *SMALL, f"run_dir={runs[name]}/run", f"data.cache_dir={runs[name]}/cache")
    differ = differences(runs["base"] / "run/checkpoint_last.pt", runs["this"] / "run/checkpoint_last.pt")
    emit(measurement="same_training", updates=14, identical=not differ, differing=differ[:10])
    split = folder / "split"
    seven = [o if not o.startswith("train.max_steps=") else "train.max_steps=7" for o in SMALL]
    translate(base, "train", *seven, f"run_dir={split}/run", f"data.cache_dir={split}/cache")
    translate(ROOT, "train", *SMALL, f"run_dir={split}/run", f"data.cache_dir={split}/cache")
    differ = differences(runs["base"] / "run/checkpoint_last.pt", split / "run/checkpoint_last.pt")
    emit(measurement="same_resume", updates="7 (base) + 7 (this)", identical=not differ, differing=differ[:10])
    return runs["this"] / "run/checkpoint_last.pt"


def comparable(path: Path) -> bytes:
    """A file's bytes; a run record's without the seconds things took (tune's record) and with
    its own folder's name (in the commands it keeps) made the same for both trees."""
    if path.name != "run_record.json":
        return path.read_bytes()
    text = path.read_text(encoding="utf-8").replace(path.parent.name, "outputs")

    def timeless(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: timeless(v) for k, v in value.items() if k != "seconds"}
        return [timeless(v) for v in value] if isinstance(value, list) else value

    return json.dumps(timeless(json.loads(text)), sort_keys=True).encode()


def same_outputs(base: Path, checkpoint: Path, folder: Path) -> None:
    digests: Dict[str, Dict[str, str]] = {}
    for name, tree in (("base", base), ("this", ROOT)):
        out = folder / f"outputs-{name}"
        common = ["config=tiny", f"data.path={MULTI30K}", f"decode.checkpoint={checkpoint}", f"run_dir={out}"]
        translate(tree, "decode", *common, f"decode.output={out}/beam4.de")
        translate(tree, "decode", *common, "decode.beam_size=1", f"decode.output={out}/greedy.de")
        translate(tree, "decode", *common, "decode.nbest=4", f"decode.output={out}/nbest4.de")
        translate(tree, "decode", *common, "decode.sampling=true", "decode.top_p=0.9", "decode.temperature=0.8",
                  f"decode.output={out}/sampled.de")
        translate(tree, "export", *common, f"export.checkpoint={checkpoint}", f"export.output={out}/ct2")
        translate(tree, "export", *common, f"export.checkpoint={checkpoint}", "export.format=transformers",
                  f"export.output={out}/hf")
        tuned = translate(tree, "tune", *common, "tune.sentences=100").stdout  # each alpha's line, then the choice
        (out / "tune.txt").write_text(re.sub(r" \([\d.]+ s\)", "", tuned))  # its seconds aside
        digests[name] = {str(p.relative_to(out)): hashlib.sha256(comparable(p)).hexdigest() for p in sorted(out.rglob("*"))
                         if p.is_file() and "hydra" not in p.parts and p.name != "translate_export.json"
                         and not p.name.endswith(".decoded.json")}  # decode's record of when, where and which code
    differ = sorted(k for k in set(digests["base"]) | set(digests["this"]) if digests["base"].get(k) != digests["this"].get(k))
    emit(measurement="same_outputs", files=sorted(digests["this"]), identical=not differ, differing=differ)


def throughput(base: Path, rounds: int, threads: int, folder: Path) -> None:
    """The tiny model's whole training loop in each tree, interleaved (bench_fairseq's measure)."""
    for round_ in range(1, rounds + 1):
        rates = {}
        for name, tree in (("base", base), ("this", ROOT)):
            run_dir = folder / f"speed-{name}-{round_}"  # a fresh run each time: nothing to resume
            overrides = bench_fairseq.train_overrides("tiny", 60, threads, run_dir) + [f"data.path={MULTI30K}"]
            result = translate(tree, "train", *overrides)  # the data named: the worktree has no ../shared
            rates[name] = bench_fairseq.steady_rate(result.stderr)
        emit(measurement="throughput", round=round_, model="tiny", threads=threads,
             base_target_tokens_per_s=round(rates["base"], 1), this_target_tokens_per_s=round(rates["this"], 1),
             ratio=round(rates["this"] / rates["base"], 3))


def preset_run(tree: Path, preset: str, minutes: float, threads: int, run_dir: Path,
               overrides: Sequence[str] = ()) -> Dict[str, Any]:
    """One `translate train config=PRESET OVERRIDES...` of `minutes` in `tree`: its updates, target
    tokens/s over the whole run (start-up, checkpoints and validation included, from its run
    record) and the mean MFU of its log windows."""
    result = translate(tree, "train", f"config={preset}", *overrides, f"train.max_minutes={minutes}",
                       f"train.threads={threads}", f"run_dir={run_dir}", f"data.path={MULTI30K}",
                       f"data.cache_dir={ROOT / 'cache'}")
    training = json.loads((run_dir / "run_record.json").read_text())["training"]
    windows = [float(m) for m in re.findall(r"\] - update \d+: .* mfu (\d+)% of", result.stderr)]
    peak = re.findall(r"mfu \d+% of ([\d.]+ TFLOP/s \w+) peak", result.stderr)
    return {"updates": training["updates"], "seconds": round(training["seconds"], 1),
            "target_tokens_per_s": round(training["target_tokens"] / training["seconds"], 1),
            "mfu_percent": round(sum(windows) / len(windows), 1) if windows else None, "peak": peak[-1] if peak else None}


def preset_throughput(base: Path, preset: str, minutes: float, rounds: int, threads: int, folder: Path,
                      overrides: List[str]) -> None:
    """The preset's whole loop for `minutes` in each tree (this one with `overrides`), alternating
    base, this, this, base, ..."""
    for round_ in range(1, rounds + 1):
        order = [("base", base), ("this", ROOT)]
        runs = {}
        for name, tree in (order if round_ % 2 else order[::-1]):
            own = overrides if name == "this" else []
            runs[name] = preset_run(tree, preset, minutes, threads, folder / f"{preset}-{name}-{round_}", own)
            emit(measurement="preset_run", round=round_, tree=name, preset=preset, minutes=minutes, threads=threads,
                 overrides=own, **runs[name])
        emit(measurement="preset_round", round=round_, preset=preset, minutes=minutes,
             base_updates=runs["base"]["updates"], this_updates=runs["this"]["updates"],
             ratio=round(runs["this"]["updates"] / runs["base"]["updates"], 3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD", help="the revision to compare with (a commit, a branch)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved throughput rounds (0: none)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--preset", default=None, help="only the speed of this preset's whole loop (config=PRESET)")
    parser.add_argument("--minutes", type=float, default=5.0, help="each preset run's train.max_minutes")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides of this tree's preset runs, after the preset (with --preset)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder, base = Path(scratch), Path(scratch) / "base-tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            commits = [bench_fairseq.commit(ROOT, revision) for revision in (args.base, "HEAD")]
            dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                        capture_output=True, text=True).stdout.strip())
            emit(measurement="trees", base=args.base, base_commit=commits[0], this=str(ROOT), this_commit=commits[1],
                 this_dirty=dirty, this_overrides=args.set, machine=bench_fairseq.machine())
            if args.preset:
                preset_throughput(base, args.preset, args.minutes, args.rounds, args.threads, folder, args.set)
                return
            checkpoint = same_training(base, folder)
            same_outputs(base, checkpoint, folder)
            throughput(base, args.rounds, args.threads, folder)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)


if __name__ == "__main__":
    main()
