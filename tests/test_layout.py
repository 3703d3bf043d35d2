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

import ast
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
    translate.core.variants.TABLE_3, row for row, in its order."""
    from translate.core.variants import TABLE_3

    lines = (ROOT / "docs" / "table3.md").read_text(encoding="utf-8").splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| row | variant |"))
    shown = []
    for line in lines[header + 2 :]:  # after the |---| line
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        shown.append((cells[1], re.findall(r"`([^`]+)`", cells[2]), cells[3]))
    expected = [(name, v.overrides, f"{v.paper_params}M" if v.paper_params else "") for name, v in TABLE_3.items()]
    assert shown == expected, "docs/table3.md's table differs from translate.core.variants.TABLE_3"


# --- The layers (docs/design.md), held to the code by reading its imports ---------------------

# Each module's floor, from the ground up; a module imports only from floors below its own, or
# from its own floor where that is not the verbs' (a part may use another part; a verb never
# uses another verb). The foundations and the verbs are packages of their own (translate/core/,
# translate/verbs/): a module put there has its floor. Any other new module gets a floor here,
# and a line in the README's Layout.
FLOORS = {
    "foundations": ["translate", "translate.core"],
    "parts": ["translate.data", "translate.attention", "translate.kernels", "translate.model", "translate.attention_maps",
              "translate.search", "translate.checkpoint", "translate.averaging", "translate.metrics", "translate.figures"],
    "engines": ["translate.translator", "translate.training", "translate.formats"],
    "verbs": ["translate.verbs"],
    "command line": ["translate.cli", "translate.hydra_cli", "translate.__main__"],
}
# Within the engines, the Translator comes first: training validates and the formats export through it.
ENGINE_ORDER = ["translate.translator", "translate.formats", "translate.training"]
VERBS_PACKAGE = "translate.verbs"  # each module in it is a unit of its own: verbs never import one another
TRAIN_VERB = "translate.verbs.train"
MAX_LINES = 400
MAX_POSITIONAL = 6


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict:
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}


def imports_of(path: Path, known: set) -> set:
    """The translate modules a file imports, anywhere in it (function bodies included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != "translate":
                found.add(name)
    return found


def floor_of(name: str) -> tuple:
    """(floor number, rank within the engines, unit) of a module: its own entry or its package's.
    The unit is what may import itself freely: a package, but each verb alone."""
    for number, members in enumerate(FLOORS.values()):
        for member in sorted(members, key=len, reverse=True):
            if name == member or name.startswith(member + ".") and member != "translate":
                rank = next((i for i, e in enumerate(ENGINE_ORDER) if name == e or name.startswith(e + ".")), 0)
                return number, rank, name if member == VERBS_PACKAGE else member
    if name == "translate":
        return 0, 0, "translate"
    raise AssertionError(f"{name} has no floor in tests/test_layout.py FLOORS")


def graph() -> dict:
    found = modules()
    known = set(found)
    return {name: imports_of(path, known) - {name} for name, path in found.items()}


def test_every_module_has_a_floor() -> None:
    for name in modules():
        floor_of(name)


def test_imports_run_down_the_floors_and_never_between_verbs() -> None:
    wrong = []
    for name, imported in graph().items():
        floor, rank, unit = floor_of(name)
        for other in imported:
            other_floor, other_rank, other_unit = floor_of(other)
            if other_unit == unit:
                continue  # within one module or package
            same_floor_ok = other_floor == floor and floor != 3 and (floor != 2 or other_rank <= rank)
            if other_floor > floor or (other_floor == floor and not same_floor_ok):
                wrong.append(f"{name} -> {other}")
    assert not wrong, f"imports up the floors, or between verbs: {sorted(wrong)}"


def test_only_the_train_verb_imports_the_training_package() -> None:
    outside = [f"{name} -> {other}" for name, imported in graph().items() for other in imported
               if other.startswith("translate.training") and not name.startswith("translate.training")
               and name != TRAIN_VERB]
    assert not outside, f"translate/training/ is the train verb's own package: {outside}"


def test_no_import_circle() -> None:
    edges = graph()
    state: dict = {}

    def visit(name: str, trail: list) -> None:
        state[name] = "open"
        for other in sorted(edges.get(name, ())):
            if state.get(other) == "open":
                raise AssertionError(f"import circle: {' -> '.join(trail[trail.index(other):] + [other])}")
            if other not in state:
                visit(other, trail + [other])
        state[name] = "done"

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])


def test_modules_stay_small() -> None:
    long = {name: n for name, path in modules().items() if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concept): {long}"


def test_no_call_with_a_long_positional_list() -> None:
    """A call of more than MAX_POSITIONAL positional arguments names them instead."""
    long = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and len(node.args) > MAX_POSITIONAL:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} ({len(node.args)} positional)")
    assert not long, f"calls with more than {MAX_POSITIONAL} positional arguments: {long}"


def test_the_output_cap_is_computed_in_one_function() -> None:
    """decode.max_len_a and max_len_b are read by DecodeConfig.output_cap alone, and no caller
    adds to or takes from what output_cap or output_limit return (output_limit adds the EOS)."""
    readers, arithmetic = [], []
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        functions = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for function in functions:
            for node in ast.walk(function):
                if isinstance(node, ast.Attribute) and node.attr in ("max_len_a", "max_len_b") and function.name != "output_cap":
                    readers.append(f"{name}.{function.name}")
                if (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))
                        and any(isinstance(side, ast.Call) and getattr(side.func, "attr", "") in ("output_cap", "output_limit")
                                for side in (node.left, node.right))
                        and function.name not in ("output_limit", "positions")):  # positions adds BOS
                    arithmetic.append(f"{name}.{function.name}:{node.lineno}")
    assert not readers, f"the cap's settings read outside DecodeConfig.output_cap: {readers}"
    assert not arithmetic, f"arithmetic on the output cap outside DecodeConfig.output_limit: {arithmetic}"


def test_the_design_page_draws_the_floors_as_they_are() -> None:
    """docs/design.md's drawing of the floors (its first code block: a line per floor that starts
    with its number, then its modules and packages, continued on indented lines) names the
    modules of FLOORS, each on its own floor."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    block = text.split("```", 2)[1]
    drawn: dict = {}
    floor = None
    for line in block.splitlines():
        number = re.match(r"(\d)\s+(\w[\w ]*?)\s{2,}", line)
        if number:
            floor = list(FLOORS)[int(number.group(1)) - 1]
            assert number.group(2) == floor, f"design.md floor {number.group(1)} is '{number.group(2)}', not '{floor}'"
        if floor is not None:
            names = re.findall(r"(?<![\w./])([a-z_]+)(\.py\b|/)", line)
            drawn.setdefault(floor, set()).update("translate" + ("" if n == "__init__" else "." + n) for n, _ in names)
    expected = {floor: set(members) - {"translate"} for floor, members in FLOORS.items()}
    assert drawn == expected, f"docs/design.md draws {drawn}, the code has {expected}"


def test_each_verb_is_a_module_of_the_verbs_package():
    """translate/verbs/ holds the command line's verbs, one module each named as the verb, and
    nothing else; cli.VERBS points at them."""
    from translate.cli import VERBS

    held = {p.stem for p in (PACKAGE / "verbs").glob("*.py") if p.name not in NOT_NAMED}
    assert held == set(VERBS), f"translate/verbs/ holds {sorted(held)}, the verbs are {sorted(VERBS)}"
    assert all(target == f"{VERBS_PACKAGE}.{verb}:{verb}" for verb, (target, _) in VERBS.items()), VERBS


# --- The run files are read by their classes alone; no module writes another's globals --------

# The key names of the run files that other dicts of the code use too, so that a read of them
# elsewhere says nothing: bleu's report and the dev metrics, the log's metrics and tune's scores,
# the schedule's state, the configuration's sections, the sides of a pair, the checkpoint's
# keys (checked with the checkpoint's own), and tune's settings beside a checkpoint, whose
# weights and search a score's record of its decode names too.
SHARED_KEYS = {"bleu", "hyp", "lines", "scores", "text", "variant", "model_flops", "seconds", "ratio", "update", "updates",
               "settings", "data", "train", "name", "size", "source", "target", "device", "precision",
               "model", "specials", "vocabulary", "languages", "processes", "skipped_updates", "valid",
               "sentences", "literature", "split", "weights", "averaged", "fingerprint", "length_penalty", "beam_size"}
# The checkpoint payload's keys, but "step" (also torch's optimizer state) and "specials" (also
# an export's marker file).
CHECKPOINT_KEYS = {"model", "model_config", "vocabulary", "languages", "lowercase", "optimizer", "scheduler", "scaler",
                   "config", "processes", "valid", "skipped_updates", "averaged"}
# `global` statements that stay, each a fact of the process that its module alone writes and reads:
# host_memory sets glibc's malloc once per process.
GLOBALS_ALLOWED = {"translate.core.host_memory": {"_applied"}}


def json_keys(cls) -> set:
    """The keys a JsonObject class names, its parts' included (not those its REST field keeps)."""
    from dataclasses import fields
    from typing import get_args, get_type_hints

    from translate.core.json_fields import JsonObject

    keys, kinds = set(), get_type_hints(cls)
    for item in fields(cls):
        if item.name == cls.REST:
            continue
        keys.add(item.name)
        stack = [kinds[item.name]]
        while stack:
            kind = stack.pop()
            if isinstance(kind, type) and issubclass(kind, JsonObject):
                keys |= json_keys(kind)
            stack += get_args(kind)
    return keys


def string_key_reads(tree: ast.AST):
    """(key, line) of each read by a literal string key: x["key"], x.get("key"), x.pop("key"),
    x.setdefault("key"), "key" in x."""
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
              and node.func.attr in ("get", "pop", "setdefault") and isinstance(node.args[0], ast.Constant)):
            key = node.args[0].value
        elif (isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant)
              and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)):
            key = node.left.value
        if isinstance(key, str):
            yield key, node.lineno


def reads_outside(keys: set, owner: str) -> List[str]:
    return [f"{path.relative_to(ROOT)}:{line} [{key!r}]" for name, path in modules().items() if name != owner
            for key, line in string_key_reads(ast.parse(path.read_text(encoding="utf-8"))) if key in keys]


def test_the_shared_keys_are_keys_of_the_run_files() -> None:
    """SHARED_KEYS names keys the run files have (a key the classes dropped goes from it too)."""
    from translate.core.run_record import RunRecord
    from translate.data.report import DataReport

    stale = SHARED_KEYS - json_keys(RunRecord) - json_keys(DataReport) - CHECKPOINT_KEYS
    assert not stale, f"SHARED_KEYS names keys no run file has: {sorted(stale)}"


def test_no_module_reads_the_run_record_or_the_data_report_by_string_keys() -> None:
    """The run record is read through RunRecord (core/run_record.py), the data report through
    DataReport (data/report.py): no other module reads their keys by name."""
    from translate.core.run_record import RunRecord
    from translate.data.report import DataReport

    found = (reads_outside(json_keys(RunRecord) - SHARED_KEYS, "translate.core.run_record")
             + reads_outside(json_keys(DataReport) - SHARED_KEYS, "translate.data.report"))
    assert not found, f"run record or data report keys read outside their classes: {found}"


def test_no_module_reads_the_checkpoint_by_string_keys() -> None:
    """The checkpoint payload is read in translate/checkpoint.py alone."""
    found = reads_outside(CHECKPOINT_KEYS, "translate.checkpoint")
    assert not found, f"checkpoint keys read outside translate/checkpoint.py: {found}"


def test_string_key_reads_are_found() -> None:
    """The two checks above can fail: each form of read is found."""
    code = 'a["train_pairs_kept"]\nb.get("coverage")\nc.pop("optimizer", None)\n"xxh3_64" in d\ne["kept"] = 1\n'
    assert [key for key, _ in string_key_reads(ast.parse(code))] == ["train_pairs_kept", "coverage", "optimizer", "xxh3_64"]


def module_aliases(tree: ast.AST, known: set) -> set:
    """The names under which a file imports translate modules (`from translate.core import paths`,
    `import translate.data.cache as cache`)."""
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            aliases |= {alias.asname or alias.name for alias in node.names if f"{node.module}.{alias.name}" in known}
        elif isinstance(node, ast.Import):
            aliases |= {alias.asname for alias in node.names if alias.asname and alias.name in known}
    return aliases


def foreign_writes(tree: ast.AST, known: set) -> List[tuple]:
    """(line, what) of each write to another module's global: `module.NAME = ...` (or +=, or
    setattr(module, ...)) on an imported translate module."""
    aliases, found = module_aliases(tree, known), []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
            targets = [ast.Attribute(value=node.args[0], attr="?")]
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id in aliases:
                found.append((node.lineno, f"{target.value.id}.{target.attr}"))
    return found


def test_no_module_writes_another_modules_globals() -> None:
    """What one module tells another goes as a value (an argument, an object it is given), not
    through a global set from outside; and `global` statements only where GLOBALS_ALLOWED says why."""
    found, known = modules(), set(modules())
    writes, globals_ = [], []
    for name, path in found.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        writes += [f"{path.relative_to(ROOT)}:{line} {what}" for line, what in foreign_writes(tree, known)]
        globals_ += [f"{path.relative_to(ROOT)}:{node.lineno} global {', '.join(node.names)}" for node in ast.walk(tree)
                     if isinstance(node, ast.Global) and not set(node.names) <= GLOBALS_ALLOWED.get(name, set())]
    assert not writes, f"modules that write another module's globals: {writes}"
    assert not globals_, f"`global` statements (hold the value in an object that is passed instead): {globals_}"


def test_writes_to_another_modules_globals_are_found() -> None:
    code = ("from translate.core import run_record\nimport translate.training.distributed as distributed\n"
            "run_record.COMMAND = 'x'\ndistributed._joined += 1\nsetattr(run_record, 'COMMAND', 'y')\nlocal.x = 1\n")
    known = {"translate.core.run_record", "translate.training.distributed"}
    assert [line for line, _ in foreign_writes(ast.parse(code), known)] == [3, 4, 5]
