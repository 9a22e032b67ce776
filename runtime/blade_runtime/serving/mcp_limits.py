"""The bounds of an MCP stdio connection, apart from the transport: ``blade-runtime mcp`` reads
them before it listens, and importing the MCP SDK (over half a second) waits until it has."""

from __future__ import annotations

from dataclasses import dataclass

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The largest message a client may send (the SDK's HTTP body limit too)."""
MAX_IN_FLIGHT = 64
"""Requests a client may have unanswered before the server stops reading more."""
GRACE_S = 5.0
"""How long requests in flight may finish after a stop, before they are cancelled."""


@dataclass(frozen=True, slots=True)
class StdioLimits:
    """Bounds of one stdio connection (see ``blade_runtime.serving.mcp_stdio``)."""

    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_in_flight: int = MAX_IN_FLIGHT
    grace_s: float = GRACE_S


STDIO_LIMITS = StdioLimits()
