"""Problems with the input, collected as values and reported together.

Every stage reports what is wrong with the user's specs as :class:`Problem` values, so a build
shows all of them at once, one line each: ``path:line:col: pointer: message (hint)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def pointer(*segments: str | int) -> str:
    """A JSON pointer (RFC 6901) from raw segments."""
    return "".join("/" + str(s).replace("~", "~0").replace("/", "~1") for s in segments)


@dataclass(frozen=True, slots=True, order=True)
class Problem:
    """One thing wrong with one file, at one JSON pointer, and how to fix it."""

    path: str
    line: int
    column: int
    pointer: str
    message: str
    hint: str = ""

    def __str__(self) -> str:
        where = self.pointer or "/"
        text = f"{self.path}:{self.line}:{self.column}: {where}: {self.message}"
        text = text + f" ({self.hint})" if self.hint else text
        # One line each, whatever the spec text held.
        return text.replace("\r", "\\r").replace("\n", "\\n")


class SpecError(Exception):
    """The spec set cannot be built; carries every problem found."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems: Sequence[Problem] = sorted(problems)
        super().__init__("\n".join(str(p) for p in self.problems))
