#!/usr/bin/env python
"""Where an update's time goes in our trainer and in fairseq 0.12.2's, side by side: one JSON line
per measurement.

Each trainer runs its own whole loop as bench_fairseq.py times it (the same model size, Multi30k
EN-DE with an 8k joint vocabulary, 4,096-token batches, dropout 0.1, 2 threads, no checkpoints),
and torch.profiler records updates 11-30 of it: from the start of update 11 to the start of
update 31, so the window holds whole loop iterations (data, step, optimizer, logging). Prints a
summary line per trainer, then the operators that take the most self time on either side, in ms
per update. fairseq comes from ../shared/anchors/fairseq (run.sh, with a sitecustomize that
hooks fairseq's Trainer.train_step); where it is not built, its side is skipped with a line.

    .venv/bin/python scripts/profile_train.py --model tiny
    .venv/bin/python scripts/profile_train.py --model base --top 16
    .venv/bin/python scripts/profile_train.py --preset multi30k_lowercase   # a preset's own model and batch, ours only
    .venv/bin/python scripts/profile_train.py --preset multi30k_lowercase --by-shape   # also the top calls by input shape
    .venv/bin/python scripts/profile_train.py --preset multi30k_lowercase --first 81 --tree /tmp/base   # after the first
        # epoch (whose new batch shapes grow the heap, page by page), in another checkout of translate
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from bench_fairseq import ANCHOR, NOT_BUILT, ROOT, anchor_built, commit, emit, threads_env, timed_overrides, train_overrides

SCRIPTS = Path(__file__).resolve().parent
FIRST, LAST = 11, 30  # the profiled updates; the first 10 are left out, as in bench_fairseq

# Runs at start-up of every Python in fairseq's venv while PROFILE_TRAIN_OUT is set; hooks
# fairseq-train only. (sys.argv is already set when site imports it.)
SITECUSTOMIZE = """
import os, sys
if os.environ.get("PROFILE_TRAIN_OUT") and sys.argv and sys.argv[0].endswith("fairseq-train"):
    import profile_train
    from fairseq import trainer
    profile_train.wrap(trainer.Trainer, "train_step", int(os.environ["PROFILE_FIRST"]), int(os.environ["PROFILE_LAST"]),
                       os.environ["PROFILE_TRAIN_OUT"], lambda self, samples, *a, **k: sum(int(s["ntokens"]) for s in samples if s))
"""

# Our CLI in a process whose translate.training.trainer.train_step (one update's forward and backward,
# which the loop calls once per update) is hooked the same way.
OURS = """
import os, sys
sys.path.insert(0, os.environ["PROFILE_SCRIPTS"])
import profile_train, translate.training.trainer
profile_train.wrap(translate.training.trainer, "train_step", int(os.environ["PROFILE_FIRST"]), int(os.environ["PROFILE_LAST"]),
                   os.environ["PROFILE_TRAIN_OUT"], lambda objective, batches, *a, **k: sum(b.target_tokens for b in batches))
from translate.cli import main
main()
"""


def wrap(owner: Any, name: str, first: int, last: int, out: str, target_tokens: Callable[..., int]) -> None:
    """Replace the update function owner.name: torch.profiler starts as update `first` begins
    and stops as update `last + 1` begins, so that the window holds whole loop iterations; the
    operator table, the window's seconds and its target tokens (target_tokens(*args)) go to `out`
    as JSON. Runs inside the profiled trainer's process: the standard library and torch only."""
    import torch

    update = getattr(owner, name)
    seen = {"calls": 0, "tokens": 0, "started": 0.0}
    by_shape = bool(os.environ.get("PROFILE_SHAPES"))
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=by_shape)

    @functools.wraps(update)
    def profiled(*args, **kwargs):
        seen["calls"] += 1
        n = seen["calls"]
        if n == first:
            profiler.start()
            seen["started"] = time.perf_counter()
        elif n == last + 1:
            seconds = time.perf_counter() - seen["started"]
            profiler.stop()
            _write(out, profiler, seconds, last - first + 1, seen["tokens"], by_shape)
        if first <= n <= last:
            seen["tokens"] += target_tokens(*args, **kwargs)
        return update(*args, **kwargs)

    setattr(owner, name, profiled)


def _write(out: str, profiler, seconds: float, updates: int, tokens: int, by_shape: bool = False) -> None:
    ops = [{"op": e.key, "self_us": e.self_cpu_time_total, "calls": e.count} for e in profiler.key_averages()]
    profile = {"seconds": seconds, "updates": updates, "target_tokens": tokens, "ops": ops}
    if by_shape:  # the same operators split by the shapes of their inputs: which tensor each call worked on
        profile["shapes"] = [{"op": e.key, "shapes": str(e.input_shapes), "self_us": e.self_cpu_time_total, "calls": e.count}
                             for e in profiler.key_averages(group_by_input_shape=True)]
    with open(out, "w") as f:
        json.dump(profile, f)


def profile_env(out: Path, threads: int, pythonpath: str, by_shape: bool = False, first: int = FIRST) -> Dict[str, str]:
    last = first + LAST - FIRST
    return dict(threads_env(threads), PROFILE_TRAIN_OUT=str(out), PROFILE_FIRST=str(first), PROFILE_LAST=str(last),
                PROFILE_SCRIPTS=str(SCRIPTS), PYTHONPATH=pythonpath, PROFILE_SHAPES="1" if by_shape else "")


def ours(model: str, threads: int, folder: Path, preset: Optional[str] = None, by_shape: bool = False,
         first: int = FIRST, tree: Path = ROOT) -> dict:
    """Our side: run.sh's settings for `model`, or with `preset`, that preset as users train it (its
    model, batch, precision and schedule), without checkpoints or validation; updates first ..
    first + 19 profiled, by the translate of `tree` (a checkout: `python -c` imports from its cwd)."""
    out = folder / "ours.json"
    updates = first + LAST - FIRST + 1
    overrides = ([f"config={preset}", "checkpoint.every_epochs=0", *timed_overrides(updates, threads, folder / "ours-run")]
                 if preset else train_overrides(model, updates, threads, folder / "ours-run"))
    data = ROOT.parent / "shared" / "data" / "multi30k"  # named: another checkout may have no ../shared
    command = [sys.executable, "-c", OURS, "train", *overrides, *([f"data.path={data}"] if tree != ROOT else [])]
    result = subprocess.run(command, cwd=tree, capture_output=True, text=True,
                            env=profile_env(out, threads, "", by_shape, first))
    if result.returncode or not out.exists():
        raise SystemExit(f"our trainer failed:\n{result.stderr[-2000:]}")
    return json.loads(out.read_text())


def fairseq(model: str, threads: int, folder: Path) -> Optional[dict]:
    if not anchor_built():
        return None
    hooks = folder / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    out = folder / "fairseq.json"
    env = profile_env(out, threads, f"{hooks}:{SCRIPTS}")
    env["OUT"] = str(folder / "fairseq-run")  # run.sh's log and (unused, --no-save) checkpoint folder
    result = subprocess.run(["bash", str(ANCHOR / "run.sh"), model, str(LAST + 1)], capture_output=True, text=True,
                            env=env)
    if result.returncode or not out.exists():
        raise SystemExit(f"fairseq-train failed:\n{result.stderr[-2000:]}")
    return json.loads(out.read_text())


def summary(trainer: str, model: str, profile: dict, **conditions: Any) -> Dict[str, float]:
    """Emits the trainer's summary line; returns its ms per update by operator (self time)."""
    updates, seconds = profile["updates"], profile["seconds"]
    per_update = {op["op"]: op["self_us"] / 1e3 / updates for op in profile["ops"]}
    in_ops = sum(per_update.values()) / (1e3 * seconds / updates)
    emit(measurement="profile_summary", trainer=trainer, model=model, **conditions, updates=updates,
         ms_per_update=round(1e3 * seconds / updates, 1),
         target_tokens_per_update=round(profile["target_tokens"] / updates, 1),
         target_tokens_per_s=round(profile["target_tokens"] / seconds, 1), share_in_operators=round(in_ops, 3))
    return per_update


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", choices=["tiny", "base"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=12, help="operators listed from each side's top")
    parser.add_argument("--preset", default=None,
                        help="profile this preset's own model and batch (config=PRESET); ours only, --model unused")
    parser.add_argument("--first", type=int, default=FIRST,
                        help="the first of the 20 updates profiled (ours; fairseq's window stays at 11-30)")
    parser.add_argument("--tree", type=Path, default=ROOT, help="profile the translate of this checkout (ours)")
    parser.add_argument("--by-shape", action="store_true",
                        help="also list our --top calls by operator and input shapes (profile_shape lines)")
    args = parser.parse_args()
    model = f"config={args.preset}" if args.preset else args.model
    with tempfile.TemporaryDirectory() as folder:
        theirs = None if args.preset else fairseq(args.model, args.threads, Path(folder))
        mine = ours(args.model, args.threads, Path(folder), args.preset, args.by_shape, args.first, args.tree.resolve())
    sides = {"ours": summary("ours", model, mine, commit=commit(args.tree), first_update=args.first)}
    if theirs is not None:
        sides["fairseq"] = summary("fairseq", args.model, theirs)
    elif not args.preset:  # with a preset, ours alone: fairseq has no such preset
        emit(measurement="profile_summary", trainer="fairseq", skipped=NOT_BUILT)
    ops = []
    for times in sides.values():
        for op in sorted(times, key=times.get, reverse=True)[: args.top]:
            if op not in ops:
                ops.append(op)
    ops.sort(key=lambda op: -max(times.get(op, 0.0) for times in sides.values()))
    for op in ops:
        emit(measurement="profile_op", model=model, op=op,
             **{f"{side}_ms_per_update": round(times.get(op, 0.0), 2) for side, times in sides.items()})
    for call in sorted(mine.get("shapes", []), key=lambda c: -c["self_us"])[: args.top]:
        emit(measurement="profile_shape", trainer="ours", model=model, op=call["op"], shapes=call["shapes"],
             ms_per_update=round(call["self_us"] / 1e3 / mine["updates"], 2), calls_per_update=call["calls"] / mine["updates"])


if __name__ == "__main__":
    main()
