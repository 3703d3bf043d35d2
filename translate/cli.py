"""Command line: `translate VERB [hydra overrides]`: the verbs and their dispatch.

Every verb composes the same tree (configs/common.yaml), so the verbs agree on run_dir; a verb
with settings of its own has a primary config that adds them (plot.yaml, table.yaml). The verb functions take the typed
TranslateConfig and know nothing of Hydra. Hydra's glue (composing, resolvers, rewriting the
command line for sweeps and torchrun ranks) is hydra_cli.py; this module only calls hydra.main
(run_single for a plain run, which composes once).
(Hydra's submitit launcher, which must live in the hydra_plugins package, is
hydra_plugins/translate_launcher/.)
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Callable, Dict, List, Optional

from omegaconf import DictConfig

from translate.core.command_line import CommandLine
from translate.core.config import TranslateConfig
from translate.core.errors import TranslateError, describe, headline, os_error_in
from translate.hydra_cli import (
    CONFIG_DIR,
    HYDRA_QUIET,
    check_overrides,
    config_name,
    job_name,
    job_run_dir,
    quiet_hydra_warnings,
    register,
    run_single,
    single_run,
    sweep_overrides,
    to_typed,
    with_overrides,
)

# verb -> (module:function, one-line help). Modules are imported only when their verb runs,
# so that `translate` alone and `translate bleu` start fast.
VERBS: Dict[str, tuple] = {
    "prepare": ("translate.verbs.prepare:prepare", "clean, build the vocabulary and encode the corpus once (train does it too)"),
    "train": ("translate.verbs.train:train", "train a Transformer (teacher forcing, label smoothing, Adam + warmup)"),
    "decode": ("translate.verbs.decode:decode", "beam-search translation of a test split or a text file"),
    "tune": ("translate.verbs.tune:tune", "choose the length penalty on the dev split (paper, 6.1); decode then uses it"),
    "bleu": ("translate.verbs.bleu:bleu", "sacreBLEU, chrF and tokenized BLEU of decode's output"),
    "average": ("translate.verbs.average:average", "average the last checkpoint.average_last checkpoints (paper, 6.1)"),
    "table": ("translate.verbs.table:table", "runs side by side, as the paper's Table 3 (table.runs=[DIR1,DIR2])"),
    "plot": ("translate.verbs.plot:plot", "attention figures of a sentence (paper, Figures 3-5) or curves of runs (plot.kind=curves)"),
    "export": ("translate.verbs.export:export", "write the model for CTranslate2 or transformers (export.format, export.output=DIR)"),
}

USAGE = (
    "usage: translate VERB [key=value ...]\n\n"
    "verbs:\n"
    + "".join(f"  {verb:<8}{text}\n" for verb, (_, text) in VERBS.items())
    + "\nExamples:\n"
    "  translate train config=base        # Transformer base, WMT14 EN-DE (paper settings)\n"
    "  translate decode config=base       # beam 4, alpha 0.6 on newstest2014\n"
    "  translate bleu config=base         # sacreBLEU of the decode\n"
    "  translate train config=tiny --cfg job   # print the composed configuration\n"
)


def _resolve_verb(verb: str) -> Callable[..., object]:
    module_name, function_name = VERBS[verb][0].split(":")
    return getattr(importlib.import_module(module_name), function_name)


def run_verb(verb: str, cfg: TranslateConfig, command: Optional[CommandLine] = None) -> int:
    """Run a verb: its function takes the config, and the command line where it has a `command`
    parameter (the verbs that record it, or let it win over a setting stored with the weights).
    Every fault becomes one line on stderr and a non-zero exit: the user's errors
    (TranslateError), the operating system's (OSError: the path and the cause), and unexpected
    ones, whose traceback HYDRA_FULL_ERROR=1 shows instead."""
    function = _resolve_verb(verb)
    given = {"command": command or CommandLine(verb)} if "command" in inspect.signature(function).parameters else {}
    try:
        function(cfg, **given)
    except TranslateError as error:
        print(f"translate {verb}: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print(f"translate {verb}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"translate {verb}: error: {fault_line(error)}", file=sys.stderr)
        return 1
    return 0


def fault_line(error: Exception) -> str:
    """One line for an error no check of ours foresaw."""
    failed = os_error_in(error)
    if failed is not None:
        return describe(failed)
    return f"{headline(error)} (an unexpected error; HYDRA_FULL_ERROR=1 shows its traceback)"


def main(argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        sys.exit(0 if argv else 2)
    verb, overrides = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"translate: error: unknown verb '{verb}' (choose from {', '.join(VERBS)})", file=sys.stderr)
        sys.exit(2)

    register()
    quiet_hydra_warnings()

    def task(cfg: DictConfig) -> None:
        try:
            typed = to_typed(cfg)
        except TranslateError as error:
            print(f"translate {verb}: error: {error}", file=sys.stderr)
            sys.exit(1)
        typed.run_dir = job_run_dir(typed.run_dir)
        code = run_verb(verb, typed, CommandLine.of(verb, given))
        if code:
            sys.exit(code)

    given = list(overrides)  # what the user typed, before the overrides added for Hydra below
    extra = job_name(verb) + sweep_overrides(overrides)
    if int(os.environ.get("RANK", "0")) > 0:  # under torchrun, Hydra's files and logs come from rank 0 only
        extra += HYDRA_QUIET + ["hydra/hydra_logging=disabled"]
    everything = with_overrides(overrides, extra)
    # Hydra reads sys.argv (the job, hence its folder and log file, is named by job_name).
    sys.argv = [f"translate-{verb}"] + everything
    if single_run(overrides):  # one composition where hydra.main takes three
        problem = run_single(verb, everything, task)
    else:
        problem = check_overrides(verb, overrides)
        if not problem:
            import hydra

            hydra.main(config_path=str(CONFIG_DIR), config_name=config_name(verb), version_base="1.3")(task)()
    if problem:
        print(f"translate {verb}: error: {problem}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
