#!/usr/bin/env python
"""Faults injected into a torchrun training that restarts by itself (--max-restarts), and what
they cost: a small model on Multi30k's dev split in N processes (gloo), and in each of K
attempts a random rank sends itself SIGKILL (it dies) or SIGSTOP (it freezes, and the watchdog
of another rank ends it after train.stall_timeout) at a random update; the attempt after the
last fault runs clean. The final checkpoint_last.pt is compared, tensor for tensor, with that of
an uninterrupted run of the same command.

Prints one JSON line: faults planned (by signal) and seen (named by a rank), recoveries (restarts that
trained: the run record's), whether the weights are identical, the updates redone after each
fault (the last update rank 0 logged before it, less the update its restart resumed from), the
seconds from that update to the restarted attempt's first one, and the seconds lost per fault
(the faulted run's wall time less the uninterrupted one's, over the faults seen).

With --save-stall, instead: the seconds a checkpoint save stops training for, at base's and
big's sizes, written in the foreground and in the background (checkpoint.background), and what a
background write takes from training meanwhile (one JSON line each).

    .venv/bin/python scripts/chaos.py --faults 10 --processes 2
    .venv/bin/python scripts/chaos.py --save-stall base big
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Dict, List

from compare_trees import differences

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"

SMALL = ["config=tiny", f"data.path={MULTI30K}", "data.train_split=validation", "data.vocab_size=603", "model.d_model=32",
         "model.d_ff=64", "model.heads=2", "model.layers=1", "optim.warmup_steps=20", "train.tokens_per_batch=1500",
         "train.tokens_per_update=1500", "train.precision=fp32", "train.log_every=1", "checkpoint.every_steps=5",
         "checkpoint.every_minutes=null", "valid.every_steps=0"]

# Start-up code of every worker (a sitecustomize): in attempt TORCHELASTIC_RESTART_COUNT, the
# planned rank sends itself the planned signal at the start of its planned update (of this attempt).
HOOK = """
import json, os, signal
plan = json.loads(os.environ.get("CHAOS_PLAN", "{}")).get(os.environ.get("TORCHELASTIC_RESTART_COUNT", ""))
if plan and os.environ.get("RANK") == str(plan["rank"]):
    import translate.training.trainer as t
    original, calls = t.train_step, []
    def faulty(*args, **kwargs):
        calls.append(1)
        if len(calls) == plan["update"]:
            os.kill(os.getpid(), getattr(signal, plan["signal"]))
        return original(*args, **kwargs)
    t.train_step = faulty
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args: argparse.Namespace, run_dir: Path, cache: Path, env: Dict[str, str]) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.processes}",
               f"--max-restarts={args.faults}", f"--master_port={free_port()}", "-m", "translate", "train", *SMALL,
               f"train.max_steps={args.max_steps}", f"train.stall_timeout={args.stall_timeout}", f"run_dir={run_dir}",
               f"data.cache_dir={cache}"]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)


def updates_redone(stderr: str) -> List[int]:
    """Per fault: the last update rank 0 logged in the attempt it ended, less the update the
    next attempt resumed from."""
    redone, last = [], 0
    for line in stderr.splitlines():
        logged = re.search(r"\[translate\.training\.monitor\]\[INFO\] - update (\d+):", line)
        resumed = re.search(r"resuming from .* at update (\d+)", line)
        if logged:
            last = int(logged.group(1))
        elif resumed:
            redone.append(max(last - int(resumed.group(1)), 0))
    return redone


def seconds_to_resume(stderr: str) -> List[float]:
    """Per fault: the seconds from the last update rank 0 logged in the attempt it ended to the
    first update of the next attempt (the stall's wait, where the fault was a SIGSTOP, the
    restart's start-up, and the updates redone)."""
    def stamp(line: str) -> float:  # a log line's "[2026-12-04 17:15:22,135]"
        return datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp()

    seconds, last, restarted = [], None, False
    for line in stderr.splitlines():
        if "[translate.training.monitor][INFO] - update " in line:
            if restarted and last is not None:
                seconds.append(round(stamp(line) - last, 1))
            last, restarted = stamp(line), False
        elif re.search(r"resuming from .* at update \d+", line):
            restarted = True
    return seconds


def save_stall(preset: str, folder: Path, vocabulary: int = 37000) -> Dict[str, object]:
    """What a checkpoint save stops training for at a preset's size (the paper's 37k shared
    vocabulary): checkpoint_last.pt (weights and Adam's two moments) and the numbered weights,
    written as Trainer.save writes them (atomically, on disk), from the host's memory; first in
    the foreground (checkpoint.background=false: training waits for the disk), then twice in the
    background (training waits for the copy in memory alone; the first copy faults its memory in,
    the second, the figure, reuses it as the trainer's next save does). While that write runs, a
    fixed matrix-product workload stands in for training: its speed then over its speed alone
    (the same work, after) is what the write takes from training meanwhile."""
    from dataclasses import replace

    import torch

    from translate.core.host_memory import keep_freed_memory
    from translate.hydra_cli import load_config
    from translate.model import Transformer
    from translate.training.checkpoint_writer import CheckpointWriter

    model = Transformer(replace(load_config("train", [f"config={preset}"]).model, vocab_size=vocabulary), pad_id=0)
    weights = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    moments = {i: {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
               for i, p in enumerate(model.parameters())}
    numbered = {"model": weights, "model_config": {}, "vocabulary": b"", "step": 1}  # what checkpoint.save requires
    last = {**numbered, "optimizer": {"state": moments}}
    files = [(folder / "checkpoint_last.pt", last), (folder / "numbered.pt", numbered)]
    seconds: Dict[str, object] = {}
    for name, payload in files:  # the foreground save, file by file
        started = time.monotonic()
        CheckpointWriter(background=False).save([(name, payload)])
        seconds[f"{name.stem}_s"] = round(time.monotonic() - started, 2)
        seconds[f"{name.stem}_gb"] = round(name.stat().st_size / 1e9, 2)
    seconds["foreground_stop_s"] = round(seconds["checkpoint_last_s"] + seconds["numbered_s"], 2)
    keep_freed_memory()  # as the trainer does on a CPU: the copy's pages are reused from one save to the next
    writer, a, b = CheckpointWriter(background=True), torch.randn(512, 512), torch.randn(512, 512)
    for attempt in ("first", "again"):  # the first copy faults its pages in; later ones reuse them
        started = time.monotonic()
        writer.save(files)
        stop = round(time.monotonic() - started, 2)  # the copy in memory
        chunks, busy = 0, time.monotonic()
        while writer.pending is not None and writer.pending.thread.is_alive():
            for _ in range(10):
                a @ b
            chunks += 1
        during = time.monotonic() - busy
        writer.wait()
        written = round(time.monotonic() - started, 2)
        if attempt == "first":
            seconds.update(background_first_stop_s=stop, background_first_write_s=written)
    seconds.update(background_stop_s=stop, background_write_s=written)
    quiet = time.monotonic()
    for _ in range(10 * chunks):
        a @ b
    alone = time.monotonic() - quiet
    seconds["training_speed_while_writing"] = round(alone / during, 2) if chunks else None
    for name, _ in files:
        name.unlink()
    return {"measurement": f"save_stall_{preset}", "preset": preset, "parameters": model.num_parameters(), **seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=10, help="faults, one per attempt (torchrun's --max-restarts too)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=None,
                        help="updates of the run (default: 12 per fault and 5 more, so that every fault comes before the end)")
    parser.add_argument("--stall-timeout", type=float, default=8.0, help="train.stall_timeout: the wait for a SIGSTOPped rank")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds each run may take")
    parser.add_argument("--save-stall", nargs="*", metavar="PRESET",
                        help="instead: the seconds a checkpoint save takes at these presets' sizes (base big)")
    args = parser.parse_args()
    if args.save_stall is not None:
        with tempfile.TemporaryDirectory(prefix="chaos-save-") as folder:
            for preset in args.save_stall or ["base", "big"]:
                print(json.dumps(save_stall(preset, Path(folder))), flush=True)
        return
    args.max_steps = args.max_steps or 12 * args.faults + 5
    chance = random.Random(args.seed)
    plan = {str(attempt): {"rank": chance.randrange(args.processes), "update": chance.randint(2, 12),
                           "signal": ("SIGKILL", "SIGSTOP")[attempt % 2]} for attempt in range(args.faults)}
    with tempfile.TemporaryDirectory(prefix="chaos-") as folder:
        folder = Path(folder)
        (folder / "hook").mkdir()
        (folder / "hook" / "sitecustomize.py").write_text(HOOK, encoding="utf-8")
        base = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        started = time.monotonic()
        clean = torchrun(args, folder / "clean", folder / "cache", base)
        clean_seconds = time.monotonic() - started
        if clean.returncode != 0:
            raise SystemExit(f"the uninterrupted run failed:\n{clean.stderr[-3000:]}")
        faulty_env = dict(base, CHAOS_PLAN=json.dumps(plan),
                          PYTHONPATH=os.pathsep.join([str(folder / "hook"), base["PYTHONPATH"]]))
        started = time.monotonic()
        faulted = torchrun(args, folder / "faulted", folder / "cache", faulty_env)
        faulted_seconds = time.monotonic() - started
        (Path(tempfile.gettempdir()) / "chaos-last.log").write_text(faulted.stderr, encoding="utf-8")
        record = json.loads((folder / "faulted" / "run_record.json").read_text()) if faulted.returncode == 0 else {}
        differ = differences(folder / "clean" / "checkpoint_last.pt", folder / "faulted" / "checkpoint_last.pt") \
            if faulted.returncode == 0 else ["(no checkpoint: the faulted run failed)"]
        errors = [line for line in faulted.stderr.splitlines() if line.startswith("translate train: error: rank")]
        redone, resumed = updates_redone(faulted.stderr), seconds_to_resume(faulted.stderr)
        signals = [plan[str(attempt)]["signal"] for attempt in range(len(resumed))]  # the fault before each resume
        by_signal = {sent: [s for s, k in zip(resumed, signals) if k == sent] for sent in ("SIGKILL", "SIGSTOP")}
        print(json.dumps({
            "measurement": "chaos", "processes": args.processes, "max_steps": args.max_steps, "faults": args.faults,
            "kills": {sent: sum(1 for p in plan.values() if p["signal"] == sent) for sent in ("SIGKILL", "SIGSTOP")},
            "faults_named": len(errors), "recoveries": len(record.get("restarts", [])), "exit": faulted.returncode,
            "identical": not differ, "differing": differ[:5], "updates_redone": redone,
            "updates_redone_mean": round(sum(redone) / max(len(redone), 1), 2), "updates_redone_max": max(redone, default=0),
            "seconds_to_resume": resumed,
            "seconds_to_resume_mean": {sent: round(sum(v) / len(v), 1) for sent, v in by_signal.items() if v},
            "stall_timeout": args.stall_timeout, "clean_seconds": round(clean_seconds, 1),
            "faulted_seconds": round(faulted_seconds, 1),
            "seconds_lost_per_fault": round((faulted_seconds - clean_seconds) / max(len(errors), 1), 1)}), flush=True)


if __name__ == "__main__":
    main()
