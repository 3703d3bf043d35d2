#!/usr/bin/env python
"""The mean of fairseq's last N epoch checkpoints, for the fairseq anchor (run in its venv).

`run.sh literature` averages with fairseq's scripts/average_checkpoints.py, but the PyPI sdist of
fairseq 0.12.2 that setup.sh builds has no scripts/ folder, so the anchor's run stopped after
training (exit status 2). This is our own stand-in with the same command line and result: the
newest N `checkpointEPOCH.pt` files, each parameter averaged in float64 and stored in its own
dtype, in the newest checkpoint's state (its args, config and optimizer history kept).

    python fairseq_average_checkpoints.py --inputs DIR --num-epoch-checkpoints 10 --output DIR/average.pt
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import List

import torch

EPOCH_CHECKPOINT = re.compile(r"^checkpoint(\d+)\.pt$")


def newest_epochs(folder: Path, count: int) -> List[Path]:
    """The `count` epoch checkpoints of the highest epochs in `folder`, newest first."""
    found = sorted(((int(m.group(1)), p) for p in folder.iterdir() if (m := EPOCH_CHECKPOINT.match(p.name))),
                   reverse=True)
    if len(found) < count:
        raise SystemExit(f"{folder}: {count} epoch checkpoints asked for, {len(found)} found")
    return [path for _, path in found[:count]]


def average(paths: List[Path]) -> dict:
    state = None
    sums = {}
    for path in paths:
        loaded = torch.load(path, map_location="cpu", weights_only=False)
        if state is None:
            state = loaded  # the newest: its args and config describe the average
        model = loaded["model"]
        if sums and model.keys() != sums.keys():
            raise SystemExit(f"{path}: its parameters differ from {paths[0]}'s")
        for name, tensor in model.items():
            sums[name] = sums.get(name, 0) + tensor.double()
    state["model"] = {name: (total / len(paths)).to(state["model"][name].dtype) for name, total in sums.items()}
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", required=True, type=Path, help="fairseq's --save-dir")
    parser.add_argument("--num-epoch-checkpoints", required=True, type=int)
    parser.add_argument("--output", required=True, type=Path)
    args = parser.parse_args()
    paths = newest_epochs(args.inputs, args.num_epoch_checkpoints)
    torch.save(average(paths), args.output)
    print(f"averaged {', '.join(p.name for p in paths)} into {args.output}")


if __name__ == "__main__":
    main()
