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

from compare_trees import ROOT, SMALL as COMPARED

# compare_trees.py's small model (seconds on the real Multi30k dev split, a thread a process, a
# checkpoint and a validation every 7 updates), in fp32, for as many updates as --updates.
SMALL = [o for o in COMPARED if not o.startswith("train.max_steps=")] + ["train.precision=fp32",
                                                                        "checkpoint.every_minutes=null"]
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
    """The processes below `pid` (torchrun's workers have sessions of their own), from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found.extend(sorted(frontier))
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
    parser.add_argument("--updates", type=int, default=14, help="updates of each training (each job of a sweep)")
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
