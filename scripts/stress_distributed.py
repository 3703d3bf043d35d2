#!/usr/bin/env python
"""Multi-process runs end, every time: torchrun launches back to back, two processes each (gloo),
trainings and two-job sweeps in turn, with the CPU contended by another process, each watched for
a hang. One JSON line per launch: its kind, exit code, seconds in all, and seconds from its last
update (the last checkpoint_last.pt written) to the exit of torchrun; then a summary line
(launches, hangs, the slowest exit).

    .venv/bin/python scripts/stress_distributed.py                    # 20 launches, contended
    .venv/bin/python scripts/stress_distributed.py --launches 40 --no-contention

A launch that has not ended after --timeout seconds is a hang: every process it started is
killed (its stacks are dumped first with py-spy where py-spy is installed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
# A model that trains in seconds on the real Multi30k dev split (tests/conftest.py's SMALL).
SMALL = ["config=tiny", f"data.path={MULTI30K}", "data.train_split=validation", "data.vocab_size=603",
         "model.d_model=32", "model.d_ff=64", "model.heads=2", "model.layers=1", "optim.warmup_steps=20",
         "train.tokens_per_batch=1500", "train.tokens_per_update=1500", "train.precision=fp32", "train.log_every=5",
         "checkpoint.every_steps=5", "checkpoint.every_minutes=null", "valid.every_steps=5", "valid.bleu_sentences=20"]
# Another process on the same cores: matrix products on two threads, as a second training would.
CONTENTION = """
import torch
torch.set_num_threads(2)
a = torch.randn(1024, 1024)
while True:
    a = (a @ a).clamp_(-1, 1)
"""


def emit(record: Dict) -> None:
    print(json.dumps(record), flush=True)


def descendants(pid: int) -> List[int]:
    result = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True)
    children: Dict[int, List[int]] = {}
    for line in result.stdout.split("\n"):
        if line.strip():
            child, parent = map(int, line.split())
            children.setdefault(parent, []).append(child)
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def dump_stacks(pids: List[int], folder: Path) -> Optional[str]:
    """py-spy's stacks (Python and native) of each process, into folder/stacks.txt."""
    spy = shutil.which("py-spy")
    if not spy:
        return None
    out = folder / "stacks.txt"
    with open(out, "w") as file:
        for pid in pids:
            file.write(f"=== {pid}\n")
            subprocess.run([spy, "dump", "--native", "--pid", str(pid)], stdout=file, stderr=subprocess.STDOUT, timeout=60)
    return str(out)


def launch(index: int, kind: str, folder: Path, cache: Path, updates: int, timeout: float) -> Dict:
    run_dir = folder / f"launch-{index}"
    overrides = [*SMALL, f"train.max_steps={updates}", f"run_dir={run_dir}", f"data.cache_dir={cache}"]
    if kind == "sweep":
        overrides = ["-m", *overrides, "optim.lr_scale=1,2"]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port", str(29600 + index % 300),
               "-m", "translate", "train", *overrides]
    started = time.time()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    hung, stacks = False, None
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        hung = True
        pids = [process.pid, *descendants(process.pid)]
        stacks = dump_stacks(pids, run_dir if run_dir.is_dir() else folder)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        stdout, stderr = process.communicate()
    ended = time.time()
    last = [p.stat().st_mtime for p in run_dir.rglob("checkpoint_last.pt")]
    record = {"launch": index, "kind": kind, "exit_code": process.returncode, "hung": hung,
              "seconds": round(ended - started, 1),
              "seconds_last_update_to_exit": round(ended - max(last), 1) if last else None}
    if process.returncode != 0 and not hung:
        record["error"] = (stderr.strip().splitlines() or [""])[-1][-300:]
    if stacks:
        record["stacks"] = stacks
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=20)
    parser.add_argument("--updates", type=int, default=10, help="updates of each training (each job of a sweep)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds after which a launch counts as hung")
    parser.add_argument("--no-contention", dest="contention", action="store_false",
                        help="nothing else on the CPU (default: a process of matrix products beside each launch)")
    parser.add_argument("--folder", help="where the runs go (default: a temporary folder, removed after)")
    args = parser.parse_args()
    folder = Path(args.folder) if args.folder else Path(tempfile.mkdtemp(prefix="stress-"))
    folder.mkdir(parents=True, exist_ok=True)
    cache = folder / "cache"
    subprocess.run([sys.executable, "-m", "translate", "prepare", *SMALL, f"data.cache_dir={cache}",
                    f"run_dir={folder / 'prepare'}"], cwd=ROOT, check=True, capture_output=True)
    burner = subprocess.Popen([sys.executable, "-c", CONTENTION]) if args.contention else None
    records = []
    try:
        for index in range(args.launches):
            record = launch(index, ("train", "sweep")[index % 2], folder, cache, args.updates, args.timeout)
            record["contended"] = args.contention
            emit(record)
            records.append(record)
    finally:
        if burner is not None:
            burner.kill()
        if not args.folder:
            shutil.rmtree(folder, ignore_errors=True)
    exits = [r["seconds_last_update_to_exit"] for r in records if r["seconds_last_update_to_exit"] is not None]
    emit({"summary": True, "launches": len(records), "hangs": sum(r["hung"] for r in records),
          "failed": sum(r["exit_code"] != 0 and not r["hung"] for r in records),
          "slowest_last_update_to_exit": max(exits) if exits else None, "contended": args.contention})


if __name__ == "__main__":
    main()
