#!/usr/bin/env python
"""Figures in README and docs written from the record files, never typed: each place a page
marks as

    <!-- value docs/figures/FILE.jsonl MEASUREMENT KEY[.KEY...] [FORMAT] -->0.90<!-- /value -->

gets the value at KEY (dotted for nested objects) of the last JSON line in FILE whose
"measurement" is MEASUREMENT, formatted with FORMAT (Python's format spec, default: as is; a
trailing x or % is kept: ".2fx" writes 0.90x). MEASUREMENT[FIELD=VALUE] (or [F=V,G=W]: each of them) takes the last such line
whose FIELD is VALUE too (one split of a file with a line per split). Test scores have their own
marks, which scripts/results_tables.py --fill writes from the run records.

    .venv/bin/python scripts/fill_figures.py README.md docs/results.md      # write them
    .venv/bin/python scripts/fill_figures.py --check README.md               # exit 1 where one differs

One line per page says how many values it holds; --check names each value that differs from its
record, and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

from translate.core import paths

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"(<!-- value (\S+) (\S+) (\S+)(?: (\S+))? -->)(.*?)(<!-- /value -->)", re.S)


class MissingValue(LookupError):
    """A mark that names a file, measurement or key the records do not hold."""


SELECTOR = re.compile(r"([^\[\]]+)(?:\[(\w+=[^\],]*(?:,\w+=[^\],]*)*)\])?$")


def last_record(file: Path, measurement: str, cache: Dict[Path, List[Dict[str, Any]]]) -> Dict[str, Any]:
    """The last line of file whose measurement is measurement's name and, for
    name[field=value,...], whose every such field is its value (compared as text, so that
    split=test and seed=5 both read as written)."""
    if file not in cache:
        if not file.is_file():
            raise MissingValue(f"no record file {file}")
        cache[file] = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    selector = SELECTOR.match(measurement)
    if not selector:
        raise MissingValue(f"{measurement!r} is not MEASUREMENT or MEASUREMENT[FIELD=VALUE,...]")
    name, conditions = selector.groups()
    wanted = [condition.split("=", 1) for condition in conditions.split(",")] if conditions else []
    found = [record for record in cache[file] if record.get("measurement") == name
             and all(field in record and str(record[field]) == value for field, value in wanted)]
    if not found:
        raise MissingValue(f"{file} has no measurement {measurement!r}")
    return found[-1]


def value_at(record: Dict[str, Any], key: str, where: str) -> Any:
    value: Any = record
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise MissingValue(f"{where} has no {key}")
        value = value[part]
    return value


def formatted(value: Any, spec: str) -> str:
    """The value with a format spec; a trailing x or % (after the spec) is written as is."""
    if not spec:
        return str(value)
    suffix = spec[-1] if spec[-1] in "x%" and not spec.endswith(".%") else ""
    return format(value, spec[:-1] if suffix else spec) + suffix


def fill(text: str, root: Path = ROOT) -> Tuple[str, List[Tuple[str, str, str]]]:
    """The text with each mark's value written in, and (mark, was, now) for each that changed."""
    cache: Dict[Path, List[Dict[str, Any]]] = {}
    changed: List[Tuple[str, str, str]] = []

    def written(match: "re.Match[str]") -> str:
        opening, file, measurement, key, spec, was, closing = match.groups()
        record = last_record(root / file, measurement, cache)
        now = formatted(value_at(record, key, f"{file}'s {measurement}"), spec or "")
        if now != was:
            changed.append((opening, was, now))
        return f"{opening}{now}{closing}"

    return MARK.sub(written, text), changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pages", nargs="+", help="markdown files with <!-- value ... --> marks")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 where a value differs from its record")
    args = parser.parse_args()
    differs = False
    for page in map(Path, args.pages):
        try:
            text = page.read_text(encoding="utf-8")
            new, changed = fill(text)
        except (OSError, MissingValue, json.JSONDecodeError) as error:
            sys.exit(f"fill_figures.py: error: {page}: {error}")
        for opening, was, now in changed:
            print(f"{page}: {opening} {was!r} -> {now!r}", file=sys.stderr)
        differs |= bool(changed)
        print(f"{page}: {len(MARK.findall(text))} value(s), {len(changed)} changed", file=sys.stderr)
        if changed and not args.check:
            with paths.atomic_write(page) as file:
                file.write(new)
    if args.check and differs:
        sys.exit(1)


if __name__ == "__main__":
    main()
