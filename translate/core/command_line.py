"""What the user typed: a verb and the key=value overrides after it, as a value the command line
hands to the verb. train and tune record it in the run record; decode, export and plot ask it
whether a setting was given there, since a given setting wins over one stored with the weights."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Sequence, Tuple


@dataclass(frozen=True)
class CommandLine:
    verb: str
    overrides: Tuple[str, ...] = ()  # as typed, before the command line adds its own for Hydra

    @classmethod
    def of(cls, verb: str, overrides: Sequence[str] = ()) -> "CommandLine":
        return cls(verb, tuple(overrides))

    def text(self) -> str:
        """The command as a user would type it again: `translate VERB OVERRIDES...`."""
        return " ".join(["translate", self.verb, *map(shlex.quote, self.overrides)])

    def sets(self, key: str) -> bool:
        """Whether an override sets `key` (as `key=`, `+key=` or `++key=`, or removes it: `~key`)."""
        return any(arg.lstrip("+~").split("=", 1)[0] == key for arg in self.overrides)
