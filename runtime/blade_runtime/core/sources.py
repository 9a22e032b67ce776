"""Which tools a runtime lets in by where they come from and how far they are trusted.

Every registration carries a ``source`` (``spec``, ``dynamic``, ``mcp:<server>``) and a
``trust`` level (``trusted``, ``workspace``, ``remote``). A ``SourcePolicy`` names the sources
and trust levels a runtime admits: the rest are left out of every tool list and their calls
are refused (``TOOL_NOT_ALLOWED``), as names outside ``allowed`` are.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from blade_runtime.core.registry import TRUST_LEVELS, RegistrationError


@dataclass(frozen=True, slots=True)
class SourcePolicy:
    """``sources``: the sources admitted (shell patterns: ``mcp:*`` is every MCP server), None
    for any; ``trust``: the trust levels admitted, None for any."""

    sources: frozenset[str] | None = None
    trust: frozenset[str] | None = None

    def __init__(
        self, *, sources: Collection[str] | None = None, trust: Collection[str] | None = None
    ) -> None:
        if isinstance(sources, str) or isinstance(trust, str):
            raise RegistrationError(
                "SourcePolicy: pass sources= and trust= as collections (sources={'spec'})"
            )
        unknown = sorted(set(trust or ()) - set(TRUST_LEVELS))
        if unknown:
            raise RegistrationError(
                f"SourcePolicy: unknown trust level(s) {', '.join(unknown)}; use "
                f"{', '.join(TRUST_LEVELS)}"
            )
        object.__setattr__(self, "sources", None if sources is None else frozenset(sources))
        object.__setattr__(self, "trust", None if trust is None else frozenset(trust))

    def admits(self, registration: Any) -> bool:
        """Whether ``registration`` (its ``source`` and ``trust``) is let in."""
        if self.trust is not None and registration.trust not in self.trust:
            return False
        if self.sources is None:
            return True
        source = registration.source
        return source in self.sources or any(
            fnmatch.fnmatchcase(source, pattern) for pattern in self.sources
        )
