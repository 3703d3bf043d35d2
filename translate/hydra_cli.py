"""Hydra's command-line glue: composing the config, registering schema and resolvers, rewriting
the command line for sweeps and torchrun ranks. The module where Hydra lives; cli.py only calls
hydra.main with what it finds here.

Multirun (`-m`): every job of a sweep gets its own run_dir, `<run_dir>/<its swept overrides>`
(e.g. runs/tiny-multi30k_en_de/optim.lr_scale:2), the same for train, decode and bleu, so that
`translate decode -m` with the same sweep finds what `translate train -m` wrote.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
import warnings
from pathlib import Path
from typing import Callable, List, Optional

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from translate.core.config import TranslateConfig
from translate.core.errors import TranslateError
from translate.core.paths import PROJECT_ROOT, usable_folder
from translate.data.loading import if_local, local_or_hub

CONFIG_DIR = PROJECT_ROOT / "configs"


def job_name(verb: str) -> List[str]:
    """The Hydra override that names the job after its verb: its folder (configs/common.yaml:
    <run_dir>/hydra/<verb>) and its log file (<verb>.log)."""
    return [f"hydra.job.name={verb}"]


# Hydra overrides that keep a process from writing Hydra's files (.hydra/) and log file: every
# process but rank 0 (torchrun; submitit's tasks get them from hydra_plugins/translate_launcher).
HYDRA_QUIET = ["hydra.output_subdir=null", f"hydra.job_logging.handlers.file.filename={os.devnull}"]


def sweep_job_dir(override_dirname: str) -> str:
    """The folder of one multirun job inside run_dir: its swept overrides, as Hydra's
    override_dirname with `:` and `+` (common.yaml; sweep_overrides excludes the keys not swept),
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


def config_name(verb: str) -> str:
    """A verb's primary config: configs/<verb>.yaml where the verb has settings of its own (plot
    and table write no Hydra files), else the tree every verb shares, configs/common.yaml."""
    return verb if (CONFIG_DIR / f"{verb}.yaml").is_file() else "common"


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


def load_config(verb: str, overrides: List[str]) -> TranslateConfig:
    """Compose a verb's config as the command line would (for tests, benchmarks, notebooks)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name=config_name(verb), overrides=overrides, return_hydra_config=True)
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


def sweep_overrides(overrides: List[str]) -> List[str]:
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


def _launcher_problem(verb: str, overrides: List[str]) -> Optional[str]:
    launcher = next((arg for arg in _plain_overrides(overrides) if arg.startswith("hydra/launcher=")), None)
    if launcher and not any(arg in ("--cfg", "-c", "--info", "-i") for arg in overrides):
        return f"{launcher} takes effect in a multirun only: translate {verb} -m {launcher} ..."
    return None


def _run_dir_problem(cfg: TranslateConfig) -> Optional[str]:
    problem = usable_folder(Path(cfg.run_dir))  # Hydra writes its files there before any verb runs
    return f"run_dir {cfg.run_dir}: {problem}" if problem else None


def check_overrides(verb: str, overrides: List[str]) -> Optional[str]:
    """Compose once up front so that a bad key or value, or a run_dir that cannot be written, is
    reported as one line.

    Skipped for multirun sweeps (their comma lists are not single values) and for Hydra's
    own flags, which hydra.main handles.
    """
    if _is_multirun(overrides):
        return None
    problem = _launcher_problem(verb, overrides)
    if problem:
        return problem
    try:
        cfg = load_config(verb, _plain_overrides(overrides))
    except TranslateError as error:
        return str(error)
    except Exception as error:  # Hydra's composition errors: ConfigCompositionException & co.
        return _one_line(error)
    return _run_dir_problem(cfg)


def single_run(overrides: List[str]) -> bool:
    """Whether the command line only asks for one job to run: no flag of Hydra's (-m, --cfg,
    --help, ...) and no hydra.mode. Then run_single does hydra.main's work with one composition,
    where check_overrides and hydra.main compose three times (hydra.main composes once to learn
    the mode, then again to run)."""
    plain = not any(arg.startswith("-") or arg.lstrip("+~").startswith("hydra.mode") for arg in overrides)
    return plain and internal_run_path()


def internal_run_path() -> bool:
    """Whether run_single can run a job as Hydra does: it calls Hydra 1.3's internal run path
    (hydra._internal, no public API for one composition), so another Hydra runs through
    hydra.main instead, composing three times but the same."""
    import hydra

    if not hydra.__version__.startswith("1.3."):
        return False
    try:
        from hydra._internal.hydra import Hydra
        from hydra._internal.utils import run_and_report  # noqa: F401
    except ImportError:
        return False
    return all(hasattr(Hydra, name) for name in ("create_main_hydra2", "compose_config"))


def run_single(verb: str, overrides: List[str], task: Callable[[DictConfig], None]) -> Optional[str]:
    """Compose the configuration once, check it as check_overrides does (the same one-line
    problems), then run `task` as hydra.main runs one job (Hydra.run: the same search path, job
    name, logging, output folder and Hydra files). Returns the problem, or None once the task ran.
    `overrides` are all of them, the verb's own included (with_overrides)."""
    from hydra import version
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import (
        create_automatic_config_search_path,
        detect_calling_file_or_module_from_task_function,
        detect_task_name,
        run_and_report,
    )
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import run_job
    from hydra.types import HydraContext, RunMode

    problem = _launcher_problem(verb, overrides)
    if problem:
        return problem
    version.setbase("1.3")
    calling_file, calling_module = detect_calling_file_or_module_from_task_function(task)
    search_path = create_automatic_config_search_path(calling_file, calling_module, str(CONFIG_DIR))
    hydra = Hydra.create_main_hydra2(task_name=detect_task_name(calling_file, calling_module), config_search_path=search_path)
    name = config_name(verb)
    try:
        try:  # from_shell=False: Hydra's messages as check_overrides (the compose API) gives them
            cfg = hydra.compose_config(name, overrides + ["hydra.mode=RUN"], run_mode=RunMode.RUN, from_shell=False,
                                       with_log_configuration=True)
            HydraConfig.instance().set_config(cfg)  # the ${hydra:...} resolver reads it
            task_cfg = copy.deepcopy(cfg)
            with open_dict(task_cfg):
                del task_cfg["hydra"]
            problem = _run_dir_problem(to_typed(task_cfg))
        except TranslateError as error:
            return str(error)
        except Exception as error:
            return _one_line(error)
        if problem:
            return problem
        callbacks = Callbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name=name)

        def run() -> None:
            ret = run_job(hydra_context=HydraContext(config_loader=hydra.config_loader, callbacks=callbacks),
                          task_function=task, config=cfg, job_dir_key="hydra.run.dir", job_subdir_key=None)
            callbacks.on_run_end(config=cfg, config_name=name, job_return=ret)
            _ = ret.return_value  # raises the task's exception, as Hydra.run does

        run_and_report(run)
        return None
    finally:
        GlobalHydra.instance().clear()
