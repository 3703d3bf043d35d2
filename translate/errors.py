"""The exceptions that reach the user as a single line (see cli.py), and the kinds of them
that code branches on."""


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
