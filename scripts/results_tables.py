#!/usr/bin/env python
"""The test figures of README and docs, from the run records alone: for each preset (and
setting) and each held-out split its runs scored, the mean ± standard deviation over the seeds
of the score the data set's papers report (or --metric), each run's value beside its weights,
search, code and machine as `translate decode` and `translate bleu` recorded them.

Nothing here is typed in: every figure is read from what `translate bleu` wrote in a run's
record (run_record.json). A run whose split was scored more than once says so beside the
figure ("scored 2x"); its figure is its first scoring (--scoring last: its last), the one
made before any other score of that split was seen.

    .venv/bin/python scripts/results_tables.py runs/seed5 runs/seed6 runs/seed7
    .venv/bin/python scripts/results_tables.py runs/multirun --output docs/figures --name multi30k_lowercase_seeds

Prints the markdown table; with --output, also writes it as NAME.md and one JSON line per row
(NAME.jsonl) there. With --fill FILE..., also writes each figure where a file marks its place:
between `<!-- figure PRESET SPLIT -->` and `<!-- /figure -->` (README's table, docs/results.md),
the row's mean ± sd and its seeds, so that no figure there is typed. Runs are grouped by the preset their first train command named (config=)
and the settings they trained with, less their seed and where their files are.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from translate.core import paths, run_record
from translate.core.errors import TranslateError
from translate.core.run_record import RunRecord, Score
from translate.verbs import table

PRESET = re.compile(r"(?:^|\s)config=(\S+)")


def preset_of(record: RunRecord) -> str:
    """The preset the run's first train command named (config=NAME); "" where none did."""
    found = PRESET.search((record.commands or [""])[0])
    return found.group(1) if found else ""


def setting_key(record: RunRecord) -> str:
    """The run's settings but its seed and the places of its files: runs with the same key are seeds of one recipe."""
    leaves = dict(table.leaves(record.settings or {}))
    kept = {key: value for key, value in leaves.items()
            if key not in table.PLACES and key != table.SEED and not key.startswith(table.READERS)}
    return json.dumps(kept, sort_keys=True, default=str)


def split_of(score: Score, record: RunRecord) -> Tuple[Optional[str], bool]:
    """(the split a scoring is of, whether it is held out): as bleu recorded them, else, for a
    scoring recorded before bleu said, from decode's default output name decode/<split>.<tgt>."""
    split = score.split
    if split is None:
        hyp = Path(score.hyp)
        if hyp.parent == Path(paths.DECODE) and hyp.suffix == f".{record.setting('data', 'tgt_lang', 'de')}":
            split = hyp.stem
    if split is None:
        return None, False
    held_out = score.held_out if score.held_out is not None else split != record.setting("data", "valid_split", "validation")
    return split, held_out


def metric_of(score: Score, metric: str) -> str:
    if metric != "literature":
        return metric
    return score.literature or "sacrebleu"  # recorded before bleu named its literature's score: sacreBLEU


def run_entry(run: Path, record: RunRecord, scorings: List[Score], metric: str, which: str) -> Dict[str, Any]:
    """One run's figure for one split: its chosen scoring's value, how often the split was scored, and what was decoded."""
    chosen = scorings[0] if which == "first" else scorings[-1]
    key = metric_of(chosen, metric)
    if key not in chosen.scores:
        raise TranslateError(f"{paths.run_record(run)}: its scoring of {chosen.hyp} has no {key} "
                             f"(it has {', '.join(chosen.scores)})")
    decoded = chosen.decoded
    entry: Dict[str, Any] = {"run": str(run), "seed": record.setting("train", "seed"), "metric": key,
                             "value": chosen.scores[key]["value"], "scorings": len(scorings), "scored_at": chosen.scored_at,
                             "hyp": chosen.hyp, "lines": chosen.lines,
                             "updates": record.training.updates if record.training else None,
                             "training_precision": record.training.precision if record.training else None}
    if decoded is not None:
        entry.update(checkpoint=decoded.checkpoint, update=decoded.weights.update, averaged=decoded.weights.averaged,
                     beam=decoded.beam_size, alpha=decoded.length_penalty, alpha_origin=decoded.length_penalty_origin,
                     decode_precision=decoded.decode_precision, commit=decoded.commit, cpu=decoded.machine.cpu,
                     isa=decoded.machine.isa)
    return entry


def rows(runs: List[Path], metric: str = "literature", which: str = "first",
         loaded: Optional[Dict[Path, RunRecord]] = None) -> List[Dict[str, Any]]:
    """One row per recipe and held-out split: the mean and sample standard deviation over its
    runs (None below two), each run's entry, and the most times any of them scored the split.
    `loaded`: the runs' records where the caller has read them already."""
    groups: Dict[Tuple[str, str, str], List[Dict[str, Any]]] = {}
    for run in runs:
        record = loaded[run] if loaded and run in loaded else RunRecord.load(run)
        by_split: Dict[str, List[Score]] = {}
        for score in record.scores or []:
            split, held_out = split_of(score, record)
            if held_out:
                by_split.setdefault(split, []).append(score)
        for split, scorings in by_split.items():
            entry = run_entry(run, record, scorings, metric, which)
            groups.setdefault((preset_of(record), setting_key(record), split), []).append(entry)
    found = []
    for (preset, _, split), entries in groups.items():
        values = [entry["value"] for entry in entries]
        found.append({"measurement": "test_scores", "preset": preset, "split": split, "metric": entries[0]["metric"],
                      "scoring": which, "n": len(values), "mean": statistics.mean(values),
                      "sd": statistics.stdev(values) if len(values) > 1 else None,
                      "scored_more_than_once": sum(entry["scorings"] > 1 for entry in entries),
                      "updates_range": span([entry.get("updates") for entry in entries], "{:,}"),
                      "alpha_range": span([entry.get("alpha") for entry in entries], "{}"), "runs": entries})
    return found


def span(values: List[Any], form: str) -> str:
    """The smallest and largest of the runs' values as one phrase for a page ("4,898-5,807"; one
    value when all agree; "?" for a run whose record lacks it), so that a page's conditions are
    written from the records too."""
    if any(value is None for value in values):
        return "?"
    low, high = form.format(min(values)), form.format(max(values))
    return low if low == high else f"{low}-{high}"


def figure(row: Dict[str, Any]) -> str:
    """`mean ± sd`, and beside it how often each run scored the split where any did more than once."""
    text = f"{row['mean']:.2f}" + (f" ± {row['sd']:.2f}" if row["sd"] is not None else "")
    counts = [entry["scorings"] for entry in row["runs"]]
    if max(counts) > 1:
        text += f" (test split scored {', '.join(f'{c}x' for c in counts)})"
    return text


def markdown(found: List[Dict[str, Any]]) -> str:
    lines = ["| preset | split | score | n | mean ± sd | each run | updates | alpha |", "|---|---|---|---|---|---|---|---|"]
    for row in found:
        each = ", ".join(f"{e['value']:.2f}" + (f" ({e['scorings']}x)" if e["scorings"] > 1 else "") for e in row["runs"])
        updates = ", ".join(str(e["updates"]) for e in row["runs"])
        alphas = ", ".join(str(e.get("alpha", "?")) for e in row["runs"])
        lines.append(f"| {row['preset'] or '-'} | {row['split']} | {row['metric']} | {row['n']} | {figure(row)} | {each} "
                     f"| {updates} | {alphas} |")
    return "\n".join(lines)


MARK = re.compile(r"(<!-- figure (\S+) (\S+) -->)(.*?)(<!-- /figure -->)", re.S)


def fill(text: str, found: List[Dict[str, Any]]) -> Tuple[str, int]:
    """The text with each marked figure of these rows written in (the others left as they are),
    and how many were written."""
    by_key = {(row["preset"], row["split"]): row for row in found}
    written = 0

    def figure_of(match: "re.Match[str]") -> str:
        nonlocal written
        row = by_key.get((match.group(2), match.group(3)))
        if row is None:
            return match.group(0)
        written += 1
        seeds = ", ".join(str(entry["seed"]) for entry in row["runs"])
        return f"{match.group(1)}{figure(row)}, {row['n']} seed{'s' if row['n'] > 1 else ''} ({seeds}){match.group(5)}"

    return MARK.sub(figure_of, text), written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run dirs (a multirun's folder stands for its jobs)")
    parser.add_argument("--metric", default="literature",
                        help="literature (the data set's papers' score, as bleu recorded it), or a key of bleu's "
                             "scores: sacrebleu, chrf, tokenized_bleu, lowercased_tokenized_bleu")
    parser.add_argument("--scoring", choices=("first", "last"), default="first",
                        help="which scoring of a split scored more than once is its figure")
    parser.add_argument("--output", help="a folder (docs/figures) to write NAME.md and NAME.jsonl into")
    parser.add_argument("--name", default="test_scores", help="the files' name in --output")
    parser.add_argument("--replace", action="store_true", help="write over NAME.md and NAME.jsonl where they exist")
    parser.add_argument("--fill", nargs="*", default=[], metavar="FILE",
                        help="write the figures into these files where marked (<!-- figure PRESET SPLIT -->...<!-- /figure -->)")
    args = parser.parse_args()
    try:
        found = rows(run_record.run_dirs(args.runs), args.metric, args.scoring)
    except TranslateError as error:
        sys.exit(f"results_tables.py: error: {error}")
    if not found:
        sys.exit("results_tables.py: error: no held-out split scored in these runs (translate decode, then translate bleu)")
    text = markdown(found)
    print(text)
    if args.output:
        folder = Path(args.output)
        existing = [path for path in (folder / f"{args.name}.md", folder / f"{args.name}.jsonl") if path.exists()]
        if existing and not args.replace:
            sys.exit(f"results_tables.py: error: {existing[0]} exists (--replace writes over it, --name another name)")
        with paths.atomic_write(folder / f"{args.name}.md") as file:
            file.write(text + "\n")
        with paths.atomic_write(folder / f"{args.name}.jsonl") as file:
            file.writelines(json.dumps(row) + "\n" for row in found)
    for name in args.fill:
        text, written = fill(Path(name).read_text(encoding="utf-8"), found)
        with paths.atomic_write(Path(name)) as file:
            file.write(text)
        print(f"{name}: {written} figure(s) written", file=sys.stderr)


if __name__ == "__main__":
    main()
