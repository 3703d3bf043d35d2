"""Hydra's submitit launcher (hydra-submitit-launcher) as translate runs it: SLURM or local jobs
with one task per GPU, from the same command line (`translate train -m hydra/launcher=submitit_slurm`).

The plugin's launchers with two changes, made in each task before Hydra composes its config:
translate's resolvers are registered (a submitit task is a fresh process that unpickles the
launcher; it never ran cli.main), and tasks other than rank 0 write no Hydra files and no log
file (as under torchrun). Ranks, the process group and the rendezvous are
translate/distributed.py's.

Hydra instantiates launchers only from the hydra_plugins namespace package, and imports every
module in it at start-up: this one is small, and imports submitit only inside a task.
configs/hydra/launcher/submitit_{slurm,local}.yaml select these classes: they shadow the
plugin's own configs of those names and are validated against the plugin's schemas (Hydra's
automatic schema matching, whose deprecation warning hydra_cli.quiet_hydra_warnings silences).
"""

from typing import Dict, List

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher, SlurmLauncher


def task_overrides(sweep_overrides: List[str], rank: int) -> List[str]:
    """This task's overrides: rank 0 writes Hydra's outputs, the others do not."""
    from translate.hydra_cli import HYDRA_QUIET

    return list(sweep_overrides) + (HYDRA_QUIET if rank > 0 else [])


class _RankAware:
    """Mixed into the plugin's launchers: what runs in each submitit task."""

    def __call__(self, sweep_overrides: List[str], job_dir_key: str, job_num: int, job_id: str,
                 singleton_state: Dict[type, Singleton]) -> JobReturn:
        import submitit

        from translate.hydra_cli import quiet_hydra_warnings, register

        register()  # translate's resolvers, for this job's config
        quiet_hydra_warnings()
        overrides = task_overrides(sweep_overrides, submitit.JobEnvironment().global_rank)
        return super().__call__(overrides, job_dir_key, job_num, job_id, singleton_state)  # type: ignore[misc]


class TranslateSlurmLauncher(_RankAware, SlurmLauncher):
    pass


class TranslateLocalLauncher(_RankAware, LocalLauncher):
    pass
