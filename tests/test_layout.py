"""The README's Layout section stays true: each path it names exists, and it names each module.

The convention (README.md): a heading `## Layout`, then, before the next heading, one fenced
code block. Each line of the block that starts at the left margin starts with a path relative
to the repository root, then its description:

    translate/model.py            the Transformer ...
    translate/training/           the training package ...
    hydra_plugins/translate_launcher/   ...

A path ending in `.py` names a module (a file); one ending in `/` names a folder. A line that
starts with whitespace continues the description above it and names nothing; words inside a
description are never read as paths. Prose after the block is not checked.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PACKAGE = ROOT / "translate"
NOT_NAMED = {"__init__.py", "__main__.py"}  # every package has them; the layout names the rest


def layout_block(text: str) -> List[str]:
    """The lines of the first fenced code block under the `## Layout` heading."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if re.fullmatch(r"#{2,3}\s+Layout\s*", line)), None)
    assert start is not None, "README.md has no '## Layout' heading"
    block: List[str] = []
    inside = False
    for line in lines[start + 1 :]:
        if line.startswith("```"):
            if inside:
                return block
            inside = True
        elif inside:
            block.append(line)
        elif line.startswith("#"):
            break
    raise AssertionError("README.md's Layout section has no closed ``` code block before the next heading")


def named_paths(block: List[str]) -> List[str]:
    """The path at the start of each unindented, non-blank line."""
    return [line.split()[0] for line in block if line.strip() and not line[0].isspace()]


def test_layout_block_parses() -> None:
    paths = named_paths(layout_block(README.read_text(encoding="utf-8")))
    assert len(paths) > 10, f"the Layout block names only {paths}"
    odd = [p for p in paths if not (p.endswith(".py") or p.endswith("/"))]
    assert not odd, f"Layout lines must start with a module (.py) or a folder (/): {odd}"


def test_each_path_the_layout_names_exists() -> None:
    paths = named_paths(layout_block(README.read_text(encoding="utf-8")))
    missing = [p for p in paths if not ((ROOT / p).is_file() if p.endswith(".py") else (ROOT / p).is_dir())]
    assert not missing, f"README.md's Layout names paths that do not exist: {missing}"


def test_the_layout_names_each_module_and_package() -> None:
    named = {p.rstrip("/") for p in named_paths(layout_block(README.read_text(encoding="utf-8")))}
    modules = [p for p in PACKAGE.rglob("*.py") if p.name not in NOT_NAMED and "__pycache__" not in p.parts]
    packages = [p.parent for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE]
    every = sorted(p.relative_to(ROOT).as_posix() for p in modules + packages)
    unnamed = [p for p in every if p not in named]
    assert not unnamed, f"README.md's Layout does not name: {unnamed}"


def test_the_table_3_page_shows_the_rows_the_code_has():
    """docs/table3.md's table (the rows under its `| row | variant |` header) is
    translate.config.TABLE_3, row for row, in its order."""
    from translate.config import TABLE_3

    lines = (ROOT / "docs" / "table3.md").read_text(encoding="utf-8").splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| row | variant |"))
    shown = []
    for line in lines[header + 2 :]:  # after the |---| line
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        shown.append((cells[1], re.findall(r"`([^`]+)`", cells[2]), cells[3]))
    expected = [(name, v.overrides, f"{v.paper_params}M" if v.paper_params else "") for name, v in TABLE_3.items()]
    assert shown == expected, "docs/table3.md's table differs from translate.config.TABLE_3"
