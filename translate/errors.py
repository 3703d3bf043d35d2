"""The one exception type that reaches the user as a single line (see cli.py)."""


class TranslateError(Exception):
    """A problem with the user's input, data or files: printed as one line, exit code 1."""
