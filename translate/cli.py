"""Command line: `translate VERB [hydra overrides]`. The only module that imports Hydra.

Each verb has a primary config in configs/ (train.yaml, decode.yaml, ...); all of them compose
the same tree (common.yaml), so the verbs agree on run_dir. The verb functions take the typed
TranslateConfig and know nothing of Hydra. (Hydra's submitit launcher, which must live in the
hydra_plugins package, is hydra_plugins/translate_launcher/.)

Multirun (`-m`): every job of a sweep gets its own run_dir, `<run_dir>/<its swept overrides>`
(e.g. runs/tiny-multi30k_en_de/optim.lr_scale:2), the same for train, decode and bleu, so that
`translate decode -m` with the same sweep finds what `translate train -m` wrote.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from translate.config import TranslateConfig
from translate.data.loading import if_local, local_or_hub
from translate.errors import TranslateError
from translate.paths import PROJECT_ROOT

CONFIG_DIR = PROJECT_ROOT / "configs"

# verb -> (module:function, one-line help). Modules are imported only when their verb runs,
# so that `translate` alone and `translate bleu` start fast.
VERBS: Dict[str, tuple] = {
    "prepare": ("translate.data.cache:prepare_verb", "clean, build the vocabulary and encode the corpus once (train does it too)"),
    "train": ("translate.train:train", "train a Transformer (teacher forcing, label smoothing, Adam + warmup)"),
    "decode": ("translate.decode:decode", "beam-search translation of a test split or a text file"),
    "bleu": ("translate.score:bleu", "sacreBLEU, chrF and tokenized BLEU of decode's output"),
    "average": ("translate.checkpoint:average_verb", "average the last checkpoint.average_last checkpoints (paper, 6.1)"),
    "export": ("translate.export:export", "write the model for CTranslate2 (export.output=DIR)"),
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


# Hydra overrides that keep a process from writing Hydra's files (.hydra/) and log file: every
# process but rank 0 (torchrun; submitit's tasks get them from hydra_plugins/translate_launcher).
HYDRA_QUIET = ["hydra.output_subdir=null", f"hydra.job_logging.handlers.file.filename={os.devnull}"]


def sweep_job_dir(override_dirname: str) -> str:
    """The folder of one multirun job inside run_dir: its swept overrides, as Hydra's
    override_dirname with `:` and `+` (common.yaml; main() excludes the keys that are not swept),
    e.g. `optim.lr_scale:2+train.seed:3`, a name that a `run_dir=` override takes unquoted.
    Other characters become `_`, overlong names are shortened by a hash; "." when nothing is swept."""
    name = re.sub(r"[^\w.:+@%-]", "_", override_dirname)
    if not name:
        return "."
    if len(name) > 200:
        name = name[:180] + "-" + hashlib.sha1(override_dirname.encode()).hexdigest()[:12]
    return name


def _sweep_job() -> str:
    """${sweep_job:} for hydra.sweep.subdir: this job's folder (sweep_job_dir)."""
    from hydra.core.hydra_config import HydraConfig

    return sweep_job_dir(str(HydraConfig.get().job.override_dirname))


def quiet_hydra_warnings() -> None:
    """configs/hydra/launcher/submitit_*.yaml rely on Hydra's automatic schema matching (they
    take the plugin's typed schema of the same name); Hydra warns that it is deprecated."""
    warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/submitit_\w+' is validated against ConfigStore schema")


def register() -> None:
    """Register resolvers and the typed schema with Hydra (idempotent)."""
    from hydra.core.config_store import ConfigStore

    OmegaConf.register_new_resolver("local_or_hub", local_or_hub, replace=True)
    OmegaConf.register_new_resolver("if_local", if_local, replace=True)
    OmegaConf.register_new_resolver("sweep_job", _sweep_job, replace=True)
    ConfigStore.instance().store(name="translate_schema", node=TranslateConfig)


def to_typed(cfg: DictConfig) -> TranslateConfig:
    """Resolve interpolations and build the dataclass tree; bad values become TranslateError."""
    try:
        typed = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as error:
        raise TranslateError(f"configuration: {str(error).splitlines()[0]}") from None
    except ValueError as error:
        raise TranslateError(f"configuration: {error}") from None
    assert isinstance(typed, TranslateConfig)
    return typed


def job_run_dir(run_dir: str) -> str:
    """run_dir itself for a single run; <run_dir>/<swept overrides> for a job of a multirun
    (where Hydra's hydra.sweep.subdir puts the job's Hydra files too)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return run_dir
    folder = _sweep_job()
    return run_dir if folder == "." else str(Path(run_dir) / folder)


def _resolve_verb(verb: str) -> Callable[[TranslateConfig], object]:
    module_name, function_name = VERBS[verb][0].split(":")
    return getattr(importlib.import_module(module_name), function_name)


def load_config(verb: str, overrides: List[str]) -> TranslateConfig:
    """Compose a verb's config as the command line would (for tests, benchmarks, notebooks)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name=verb, overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # the ${hydra:...} resolver reads it
    with open_dict(cfg):
        del cfg["hydra"]
    return to_typed(cfg)


def _one_line(error: Exception) -> str:
    """Hydra's multi-line composition errors as one line that still names the key."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    message = (lines[0] if lines else type(error).__name__).rstrip(".")
    if "Available options" in str(error):
        options = [line for line in lines[1:] if not line.startswith(("Available", "Config search", "provider="))]
        message += f" (available: {', '.join(options)})"
    cause = error.__cause__
    if cause is not None and str(cause).strip():
        message += f": {str(cause).splitlines()[0]}"
    return message


def _is_multirun(overrides: List[str]) -> bool:
    return any(arg in ("-m", "--multirun") for arg in overrides)


def _plain_overrides(overrides: List[str]) -> List[str]:
    """The key=value overrides, without Hydra's flags and their values."""
    plain = [arg for arg in overrides if not arg.startswith("-")]
    flags_with_values = {"--cfg", "-c", "--package", "-p", "--info", "-i", "--config-name", "-cn",
                         "--config-path", "-cp", "--config-dir", "-cd", "--experimental-rerun"}
    skip = {overrides[i + 1] for i, arg in enumerate(overrides[:-1]) if arg in flags_with_values}
    return [arg for arg in plain if arg not in skip]


def with_overrides(arguments: List[str], extra: List[str]) -> List[str]:
    """The command line's arguments with more key=value overrides, beside the user's own: Hydra's
    argument parser takes one run of overrides (`-m a=1 --cfg job b=2` fails on b=2)."""
    plain = _plain_overrides(arguments)
    if not plain:
        return arguments + extra
    first = arguments.index(plain[0])
    return arguments[:first] + extra + arguments[first:]


def _sweep_overrides(overrides: List[str]) -> List[str]:
    """For a multirun: Hydra's override_dirname (hence each job's folder) names only the swept
    keys; the others are the same for every job (and may be long paths). run_dir never counts."""
    if not _is_multirun(overrides):
        return []
    plain = _plain_overrides(overrides)
    if any(arg.startswith("hydra.job.config.override_dirname.exclude_keys") for arg in plain):
        return []  # the user's choice
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(plain)
    except Exception:  # Hydra reports it
        return []
    fixed = {o.key_or_group for o in parsed if not o.is_hydra_override() and not o.is_sweep_override()}
    keys = ",".join(f"'{key}'" for key in sorted(fixed | {"run_dir"}))
    return [f"hydra.job.config.override_dirname.exclude_keys=[{keys}]"]


def _check_overrides(verb: str, overrides: List[str]) -> Optional[str]:
    """Compose once up front so that a bad key or value is reported as one line.

    Skipped for multirun sweeps (their comma lists are not single values) and for Hydra's
    own flags, which hydra.main handles.
    """
    if _is_multirun(overrides):
        return None
    plain = _plain_overrides(overrides)
    launcher = next((arg for arg in plain if arg.startswith("hydra/launcher=")), None)
    if launcher and not any(arg in ("--cfg", "-c", "--info", "-i") for arg in overrides):
        return f"{launcher} takes effect in a multirun only: translate {verb} -m {launcher} ..."
    try:
        load_config(verb, plain)
    except TranslateError as error:
        return str(error)
    except Exception as error:  # Hydra's composition errors: ConfigCompositionException & co.
        return _one_line(error)
    return None


def run_verb(verb: str, cfg: TranslateConfig) -> int:
    """Run a verb; user errors become one line on stderr and exit code 1."""
    try:
        _resolve_verb(verb)(cfg)
    except TranslateError as error:
        print(f"translate {verb}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"translate {verb}: interrupted", file=sys.stderr)
        return 130
    return 0


def main(argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        sys.exit(0 if argv else 2)
    verb, overrides = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"translate: error: unknown verb '{verb}' (choose from {', '.join(VERBS)})", file=sys.stderr)
        sys.exit(2)

    import hydra

    problem = _check_overrides(verb, overrides)
    if problem:
        print(f"translate {verb}: error: {problem}", file=sys.stderr)
        sys.exit(1)
    register()
    quiet_hydra_warnings()

    @hydra.main(config_path=str(CONFIG_DIR), config_name=verb, version_base="1.3")
    def task(cfg: DictConfig) -> None:
        try:
            typed = to_typed(cfg)
        except TranslateError as error:
            print(f"translate {verb}: error: {error}", file=sys.stderr)
            sys.exit(1)
        typed.run_dir = job_run_dir(typed.run_dir)
        code = run_verb(verb, typed)
        if code:
            sys.exit(code)

    extra = _sweep_overrides(overrides)
    if int(os.environ.get("RANK", "0")) > 0:  # under torchrun, Hydra's files and logs come from rank 0 only
        extra += HYDRA_QUIET + ["hydra/hydra_logging=disabled"]
    overrides = with_overrides(overrides, extra)
    # Hydra reads sys.argv; the program name sets the job name (and log file name).
    sys.argv = [f"translate-{verb}"] + overrides
    task()


if __name__ == "__main__":
    main()
