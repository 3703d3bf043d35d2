"""A frozen preset stays what its seeds trained: every setting `translate train config=NAME`
composes (less where its files go) equals the snapshot taken when the preset was frozen
(issue 52: the preset's commit is named before its first seed runs, and its figure is the mean of
seeds run after). Changing a frozen preset, or a default it inherits, fails here: make a new
preset instead, or unfreeze it by removing its snapshot and saying so in docs/results.md.

Snapshot: tests/frozen/NAME.json, whose "commit" is the commit the preset was frozen at."""

import dataclasses
import json
from pathlib import Path

import pytest

from translate.core.config import ADDED_LATER

FROZEN = Path(__file__).parent / "frozen"
PLACES = {("run_dir",), ("data", "path"), ("data", "cache_dir"),  # where files go, not what trains
          ("checkpoint", "background")}  # how they are written (the same bytes: test_checkpoint_writer)
# Settings added after a freeze, at the value that trains as before (checked by their own tests:
# R-Drop's in test_loss.py, the warmup's in test_schedule.py): a snapshot without them still holds.
ADDED_OFF = {tuple(key.split(".")): off for key, off in ADDED_LATER.items()}


def settings(preset: str) -> dict:
    from translate.hydra_cli import load_config

    composed = dataclasses.asdict(load_config("train", [f"config={preset}"]))
    for place in PLACES:
        parent = composed
        for key in place[:-1]:
            parent = parent[key]
        parent.pop(place[-1])
    return json.loads(json.dumps(composed, default=str))


def without_added_off(now: dict, frozen: dict) -> dict:
    """now less the ADDED_OFF settings that the snapshot lacks and that are still off."""
    for place, off in ADDED_OFF.items():
        parent, snapshot = now, frozen
        for key in place[:-1]:
            parent, snapshot = parent[key], snapshot.get(key, {})
        if place[-1] not in snapshot and parent.get(place[-1]) == off:
            parent.pop(place[-1])
    return now


def changed(frozen: dict, now: dict, prefix: str = "") -> list:
    """The dotted keys whose values differ (or exist on one side only)."""
    keys = sorted(set(frozen) | set(now))
    out = []
    for key in keys:
        a, b = frozen.get(key, "<absent>"), now.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += changed(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


@pytest.mark.parametrize("snapshot", sorted(FROZEN.glob("*.json")), ids=lambda path: path.stem)
def test_a_frozen_preset_composes_what_it_was_frozen_with(snapshot):
    frozen = json.loads(snapshot.read_text(encoding="utf-8"))
    assert changed(frozen["settings"], without_added_off(settings(frozen["preset"]), frozen["settings"])) == []


def test_a_setting_added_after_the_freeze_counts_once_it_is_on():
    frozen = json.loads((FROZEN / "multi30k_lowercase.json").read_text(encoding="utf-8"))
    now = settings("multi30k_lowercase")
    now["train"]["rdrop"] = 5.0
    assert changed(frozen["settings"], without_added_off(now, frozen["settings"])) == ["train.rdrop: '<absent>' -> 5.0"]


def test_the_check_finds_a_changed_setting():
    frozen = json.loads((FROZEN / "multi30k_lowercase.json").read_text(encoding="utf-8"))
    now = settings("multi30k_lowercase")
    now["optim"]["warmup_steps"] += 1
    del now["checkpoint"]["average_last"]
    assert changed(frozen["settings"], without_added_off(now, frozen["settings"])) == ["checkpoint.average_last: 10 -> '<absent>'",
                                                "optim.warmup_steps: 2000 -> 2001"]
