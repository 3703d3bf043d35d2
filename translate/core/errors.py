"""The exceptions that reach the user as a single line (see cli.py), the kinds of them that
code branches on, and the one line an error of the operating system becomes."""

from __future__ import annotations

import os
import re
from typing import Optional


class TranslateError(Exception):
    """A problem with the user's input, data or files: printed as one line, exit code 1."""

    exit_code = 1


class Interrupted(TranslateError):
    """Training stopped by Ctrl-C after saving: exit code 130, as a shell expects of SIGINT."""

    exit_code = 130


class MissingSplit(TranslateError):
    """The data has no such split (a dev or test set is optional for training)."""


class MissingCheckpoint(TranslateError):
    """No checkpoint at the path (a fresh run has none to resume from)."""


class DamagedCache(TranslateError):
    """A token cache folder whose files do not match its report."""


def os_error_in(error: Optional[BaseException]) -> Optional[OSError]:
    """The OSError behind an error, or None: torch.save's zip writer wraps it in a
    RuntimeError, and libraries written in Rust (safetensors) say only "(os error N)"."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        code = re.search(r"\(os error (\d+)\)", str(error))
        if code:
            return OSError(int(code.group(1)), os.strerror(int(code.group(1))))
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def describe(error: OSError) -> str:
    """'PATH: cause' for an operating-system error (no space left on device, file too large,
    not a directory, permission denied, read-only file system, too many open files ...), or
    the cause alone where the error names no file."""
    cause = error.strerror or str(error) or type(error).__name__
    names = [str(name) for name in (error.filename, error.filename2) if name]
    return f"{' -> '.join(names)}: {cause}" if names else cause


def root_cause(error: BaseException) -> str:
    """What lies at the bottom of an error's chain (its __cause__ and __context__), as one line:
    an operating-system error's path and cause (describe), else the innermost error's first
    line. Libraries wrap the cause in errors of their own ("An error occurred while generating
    the dataset"): this is what the user can act on."""
    failed = os_error_in(error)
    if failed is not None:
        return describe(failed)
    seen = set()
    while id(error) not in seen and (error.__cause__ or error.__context__) is not None:
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return first_line(error)


def _message(error: BaseException) -> Optional[str]:
    """An error's message's first line; None where it says nothing."""
    text = str(error).strip().splitlines()
    return text[0] if text else None


def first_line(error: BaseException) -> str:
    """An error's message's first line, or its type's name where it has no message."""
    return _message(error) or type(error).__name__


def headline(error: BaseException) -> str:
    """An error as 'Type: its first line' ('Type' alone where it says nothing)."""
    message = _message(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
