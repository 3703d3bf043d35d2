"""How long CI's `make install test` takes from a fresh clone, on this machine: one JSON line.

    .venv/bin/python scripts/bench_make_test.py [--tree /work/main] [--output F.jsonl]

It clones TREE's HEAD into a temporary folder beside a link to ../shared (the test data), then
runs `make install` and `make test` there, with a fresh Hugging Face cache: as CI does, on a
machine that has never run the project. The line gives the install's seconds, the suite's count
and seconds as pytest prints them, the commit and the machine (bench_fairseq.machine()).
Run it alone: the suite takes both cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fairseq import ROOT, commit, machine  # noqa: E402

# pytest's last line, e.g. "475 passed, 2 skipped in 552.09s (0:09:12)"
SUMMARY = re.compile(r"^=*\s*(?P<counts>(?:\d+ \w+(?:, )?)+) in (?P<seconds>[\d.]+)s\b", re.MULTILINE)


def summary(output: str) -> Optional[Dict[str, float]]:
    """pytest's counts ({"passed": 475, "skipped": 2, ...}) and "seconds", from its last summary line."""
    found = list(SUMMARY.finditer(output))
    if not found:
        return None
    last = found[-1]
    counts: Dict[str, float] = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", last.group("counts"))}
    counts["seconds"] = float(last.group("seconds"))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose HEAD is cloned")
    parser.add_argument("--output", type=Path, help="also append the line to this file")
    args = parser.parse_args()
    shared = (args.tree / ".." / "shared").resolve()
    measured = commit(args.tree)  # HEAD as cloned: a commit made while the suite runs is not the one measured
    with tempfile.TemporaryDirectory(prefix="make-test-") as folder:
        clone = Path(folder) / "p"
        subprocess.run(["git", "clone", "-q", str(args.tree), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", measured], check=True)
        (Path(folder) / "shared").symlink_to(shared)
        env = {**os.environ, "HF_HOME": str(Path(folder) / "hf")}
        started = time.monotonic()
        install = subprocess.run(["make", "install"], cwd=clone, env=env, capture_output=True, text=True)
        installed = time.monotonic() - started
        if install.returncode != 0:
            said = [line for line in (install.stdout + install.stderr).splitlines() if line.strip() and not line.startswith("make")]
            last = (said or ["(no output)"])[-1]  # pip's last words, not make's "Error 1"
            sys.exit(f"bench_make_test: make install failed ({install.returncode}): {last}")
        tested = subprocess.run(["make", "test"], cwd=clone, env=env, capture_output=True, text=True)
        counts = summary(tested.stdout + tested.stderr)
    line = {"measurement": "make_test", "commit": measured, "machine": machine(),
            "install_seconds": round(installed, 1), "returncode": tested.returncode, **(counts or {})}
    text = json.dumps(line)
    print(text)
    if args.output:
        with args.output.open("a", encoding="utf-8") as out:
            out.write(text + "\n")
    if tested.returncode != 0 or counts is None:
        sys.exit(1)


if __name__ == "__main__":
    main()
