"""Every file name inside a run_dir, so that the verbs chain by default (train writes what decode
reads, decode what bleu reads); the project root, where configs/ and local datasets are found;
and the one way files and folders are written here: atomically.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import IO, Iterator, List, Optional, Tuple

from translate.core.choices import PlotKind

from translate.core.config import TranslateConfig
from translate.core.errors import TranslateError, describe, os_error_in

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the checkout: configs/ and local datasets

LAST_CHECKPOINT = "checkpoint_last.pt"  # everything needed to resume; rewritten at every save
BEST_CHECKPOINT = "checkpoint_best.pt"  # the weights with the best dev metric (valid.metric)
AVERAGE_CHECKPOINT = "checkpoint_average.pt"  # the mean of the last checkpoint.average_last numbered ones
_NUMBERED = re.compile(r"checkpoint_(\d+)\.pt")  # the weights at one update, kept for averaging
RUN_RECORD = "run_record.json"  # what the run is and has done (train keeps it, bleu adds its scores)
TRAIN_LOCK = "train.lock"  # held by the one training of this run_dir; names its holder
DATA_REPORT = "data_report.json"  # the prepared corpus: pairs kept and dropped, tokens, vocabulary
TENSORBOARD = "tensorboard"  # train's TensorBoard event files
DECODE = "decode"  # decode's translations (and the references beside them)
EXPORT = "export"  # export's folders, one per format
EXPORT_MARKER = "translate_export.json"  # inside an export: what it was made from; tells ours (safe to replace) from foreign folders
PLOTS = "plots"  # plot's figures, each with the values it draws beside it


def numbered_checkpoint(run_dir: Path, step: int) -> Path:
    """The weights at one update (kept for averaging; checkpoint.keep_last of them)."""
    return run_dir / f"checkpoint_{step}.pt"


def numbered_update(path: Path) -> Optional[int]:
    """The update a numbered checkpoint's name holds (checkpoint_<update>.pt); None for another name."""
    matched = _NUMBERED.fullmatch(path.name)
    return int(matched.group(1)) if matched else None


def numbered_checkpoints(run_dir: Path) -> List[Path]:
    """The numbered checkpoints in run_dir (checkpoint_<update>.pt), oldest first."""
    found = [(update, p) for p in run_dir.glob("checkpoint_*.pt") if (update := numbered_update(p)) is not None]
    return [p for _, p in sorted(found)]


def checkpoint_to_translate(run_dir: Path, given: Optional[str], average_last: int) -> Path:
    """The checkpoint decode, tune, plot and export read (averaging.chosen_checkpoint, which first
    builds the average where it is stale): the one given; else, where the preset averages and
    there is something to average (or an average already), the average; else the last one."""
    if given:
        return Path(given)
    run_dir = Path(run_dir)
    average = run_dir / AVERAGE_CHECKPOINT
    if average_last >= 1 and (average.is_file() or numbered_checkpoints(run_dir)):
        return average
    return run_dir / LAST_CHECKPOINT


def run_record(run_dir: Path) -> Path:
    return Path(run_dir) / RUN_RECORD


def train_lock(run_dir: Path) -> Path:
    return Path(run_dir) / TRAIN_LOCK


def data_report(run_dir: Path) -> Path:
    return Path(run_dir) / DATA_REPORT


def tensorboard(run_dir: Path) -> Path:
    return Path(run_dir) / TENSORBOARD


def decode_output(cfg: TranslateConfig) -> Path:
    """decode.output, else <run_dir>/decode/<split or input name>.<tgt_lang>."""
    if cfg.decode.output:
        return Path(cfg.decode.output)
    name = Path(cfg.decode.input).name if cfg.decode.input else cfg.decode.split
    return Path(cfg.run_dir) / decoded(name, cfg.data.tgt_lang)


def decoded(name: str, tgt_lang: str) -> PurePosixPath:
    """Where in a run_dir decode writes a split's (or input file's) translations by default."""
    return PurePosixPath(DECODE) / f"{name}.{tgt_lang}"


def decode_reference(cfg: TranslateConfig) -> Path:
    """The references decode writes beside its output when it translates a dataset split."""
    output = decode_output(cfg)
    return output.with_name(output.name + ".ref")


def export_dir(cfg: TranslateConfig) -> Path:
    """export.output, else <run_dir>/export/<format>."""
    return Path(cfg.export.output) if cfg.export.output else Path(cfg.run_dir) / EXPORT / cfg.export.format


def plot_output(cfg: TranslateConfig) -> Path:
    """plot.output, else <run_dir>/plots/<kind>.png; curves of plot.runs go in the first run's
    plots/ (a multirun's folder for its jobs)."""
    if cfg.plot.output:
        return Path(cfg.plot.output)
    folder = Path(cfg.plot.runs[0]) if cfg.plot.kind == PlotKind.curves and cfg.plot.runs else Path(cfg.run_dir)
    return folder / PLOTS / f"{cfg.plot.kind}.png"


def beside(figure: Path, suffix: str) -> Path:
    """A file beside a figure, named after it: attention.png -> attention.npz, attention.heads.png."""
    return figure.with_name(figure.stem + suffix)


@contextmanager
def atomic_write(path: Path, binary: bool = False, sync: bool = False) -> Iterator[IO]:
    """A file to write `path` through: a temporary file in the same folder, renamed over `path`
    once complete (and with `sync`, once on disk), so that readers see the old file or the new
    one. A failure (a full disk, a file-size limit, a kill) leaves the old one as it was and
    nothing half-written; an operating-system error becomes one TranslateError line that names
    `path`, the cause, and whether the previous file is intact."""
    problem = usable_folder(path.parent)
    if problem:
        raise TranslateError(f"cannot write {path}: {problem}")
    temporary: Optional[Path] = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        temporary = Path(name)
        os.fchmod(handle, _mode_for(path))  # mkstemp's 0600 would hide outputs from the user's group
        with os.fdopen(handle, "wb" if binary else "w", encoding=None if binary else "utf-8") as file:
            yield file
            if sync:
                file.flush()
                os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
        failed = os_error_in(error)
        if failed is None:
            raise
        before = f"the previous {path.name} is intact" if path.is_file() else f"no {path.name} was written"
        raise TranslateError(f"cannot write {path}: {failed.strerror or failed}; {before}") from None


@contextmanager
def atomic_folder(folder: Path, what: str) -> Iterator[Path]:
    """A staging folder to fill beside `folder`, swapped in whole once complete: where a previous
    `folder` exists, with two renames, so that readers see the old folder or the new one, never
    half of one. A failure removes the staging folder and leaves the previous one as it was; an
    operating-system error becomes one TranslateError line that names `what` (the export, the
    token cache), `folder`, the cause, and whether the previous one is intact."""
    staging: Optional[Path] = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.new-", dir=folder.parent))
        staging.chmod(0o777 & ~_umask())  # as mkdir would: mkdtemp's 0700 would hide it from the user's group
        yield staging
        _swap_in(staging, folder)
    except BaseException as error:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        failed = os_error_in(error)
        if failed is None:
            raise
        before = "the previous one is intact" if folder.exists() else "nothing of it was kept"
        raise TranslateError(f"cannot write {what} {folder}: {describe(failed)}; {before}") from None


def unfinished_writes(folder: Path, pattern: str) -> List[Tuple[Path, str]]:
    """atomic_write's temporary files in `folder` (.NAME.XXXXXXXX: mkstemp's prefix and random
    suffix) of the files whose names match the glob `pattern`, each with the name it was to
    become. Left by a writer killed part-way; only the writer of those files may delete them."""
    found = []
    for path in sorted(Path(folder).glob(f".{pattern}.*")):
        name = path.name[1:].rsplit(".", 1)[0]
        if path.is_file() and Path(name).match(pattern):
            found.append((path, name))
    return found


def remove_unfinished_folders(folder: Path) -> List[str]:
    """Delete the staging and retired folders beside `folder` that an atomic_folder killed
    part-way left (SIGKILL: its own clean-up never ran); returns their names. Only for a caller
    that alone writes `folder` meanwhile (the token cache's builder holds its lock)."""
    removed = []
    for leftover in [*folder.parent.glob(f".{folder.name}.new-*"), *folder.parent.glob(f".{folder.name}.old-*")]:
        shutil.rmtree(leftover, ignore_errors=True)
        removed.append(leftover.name)
    return sorted(removed)


def _swap_in(staging: Path, folder: Path) -> None:
    """Replace `folder` by the complete `staging` folder with two renames."""
    if not folder.exists():
        staging.rename(folder)
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-", dir=folder.parent))
    folder.rename(retired / folder.name)
    try:
        staging.rename(folder)
    except BaseException:
        (retired / folder.name).rename(folder)  # put the previous one back
        raise
    shutil.rmtree(retired, ignore_errors=True)


def _umask() -> int:
    umask = os.umask(0o022)  # reading the umask sets it: put it straight back
    os.umask(umask)
    return umask


def _mode_for(path: Path) -> int:
    """The permissions `path` gets: those it has, else what open() would give a new file (0666
    less the umask)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def usable_folder(folder: Path) -> Optional[str]:
    """Why `folder` could not be created and written (an ancestor that is a file, one that
    cannot be written), or None where it can."""
    for ancestor in [folder, *folder.absolute().parents]:
        if ancestor.exists():
            if not ancestor.is_dir():
                return f"{ancestor} is a file, not a folder"
            if not os.access(ancestor, os.W_OK | os.X_OK):
                return f"{ancestor} cannot be written"
            return None
    return None
