"""OpenTelemetry traces and metrics for every call, suspension and resume (``blade-runtime[otel]``).

``runtime.observe(Telemetry())`` makes one span per entry of a call, named and described as
OpenTelemetry's GenAI semantic conventions name a tool execution (``execute_tool {tool}``, with
``gen_ai.operation.name``, ``gen_ai.tool.name``, ``gen_ai.tool.call.id``,
``gen_ai.tool.description``, ``gen_ai.tool.type`` and ``error.type``), blade's own attributes
beside them (``blade.spec_id``, ``blade.run_id``, ``blade.side_effect``, ``blade.kind``,
``blade.outcome``, ``blade.action_id``...), the permission decisions as span events, and the
``gen_ai.execute_tool.duration`` histogram (seconds).

One trace from a call through a person's answer hours later on another worker: the first
entry's span context is stored with the call (in its context's ``extra``, as W3C
``traceparent``), so the entry that resumes or replays it, in any process, is a child of it.
A span opened inside the implementation is a child of the call's span, and a call made through
the HTTP API with a W3C ``traceparent`` header is a child of the caller's span.

It is an observer, so a runtime without it pays nothing; it never fails a call (an error of its
own is logged). Spans go where the application's tracer provider sends them (the global one
unless one is given).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import replace
from typing import Any

from blade_runtime.core.caller import CallContext
from blade_runtime.core.observers import Lifecycle
from blade_runtime.core.results import ToolError, ToolPending, ToolSkipped, ToolSuccess

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as missing:  # pragma: no cover - the extra's own message
    raise ImportError(
        "blade_runtime.otel needs OpenTelemetry's API: pip install 'blade-runtime[otel]'"
    ) from missing

log = logging.getLogger("blade_runtime")

TRACE_KEY = "blade.traceparent"
"""Where a call's context keeps the W3C traceparent of its first entry's span."""

_PROPAGATOR = TraceContextTextMapPropagator()
_SCOPE = "blade_runtime"


class Telemetry:
    """A lifecycle observer that traces and measures calls (see the module's docstring).
    ``tracer_provider`` and ``meter_provider``: the application's, else OpenTelemetry's global
    ones."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        self._tracer = trace.get_tracer(_SCOPE, tracer_provider=tracer_provider)
        meter = metrics.get_meter(_SCOPE, meter_provider=meter_provider)
        self._duration = meter.create_histogram(
            "gen_ai.execute_tool.duration",
            unit="s",
            description="How long a tool call's entry ran, from its start to its outcome.",
        )
        # The open entry of each call in this process: its span, the context token that made
        # it current in the call's task, and when it began.
        self._open: dict[str, tuple[Any, Any, float]] = {}

    async def scheduled(self, event: Lifecycle) -> None:
        """A new call: its span starts (a child of the caller's current span, if any), and its
        trace context is stored with the call for every later entry."""
        try:
            parent = None
            given = event.call.context
            remote = None if given is None else given.extra.get("traceparent")
            if isinstance(remote, str) and not trace.get_current_span().get_span_context().is_valid:
                # No span here: the caller's, as its request carried it (the HTTP API keeps a
                # request's W3C traceparent with the call it makes).
                parent = _PROPAGATOR.extract({"traceparent": remote})
            self._start(event, "initial", parent)
            span = self._open[event.call.call_id][0]
            carrier: dict[str, str] = {}
            _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
            if "traceparent" in carrier:
                given = event.call.context or CallContext()
                # A copy: the caller's own context object may be shared by other calls.
                event.call.context = replace(
                    given, extra={**given.extra, TRACE_KEY: carrier["traceparent"]}
                )
        except Exception as error:  # telemetry never fails a call
            log.warning("telemetry: %s (call %s): %r", event.call.name, event.call.call_id, error)

    async def execution_started(self, event: Lifecycle) -> None:
        """An entry begins: a re-entry (a resume or a replay, here or on another worker) opens
        its span as a child of the call's stored one."""
        try:
            if event.call.call_id in self._open:
                self._open[event.call.call_id][0].add_event("blade.execution_started")
                return
            context = event.call.context
            stored = None if context is None else context.extra.get(TRACE_KEY)
            parent = (
                _PROPAGATOR.extract({"traceparent": stored}) if isinstance(stored, str) else None
            )
            self._start(event, "re-entry", parent)
        except Exception as error:
            log.warning("telemetry: %s (call %s): %r", event.call.name, event.call.call_id, error)

    async def permission_requested(self, event: Lifecycle) -> None:
        self._event(event, "blade.permission_requested")

    async def permission_resolved(self, event: Lifecycle) -> None:
        self._event(event, "blade.permission_resolved")

    async def suspended(self, event: Lifecycle) -> None:
        """The entry ends waiting on a pending action: its span ends, outcome ``pending``."""
        await self.settled(event)

    async def settled(self, event: Lifecycle) -> None:
        """The entry's outcome: the span gets it and ends; its duration is recorded."""
        try:
            opened = self._open.pop(event.call.call_id, None)
            if opened is None:
                return
            span, token, began = opened
            outcome = event.outcome
            attributes = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": event.call.name,
            }
            if isinstance(outcome, ToolSuccess):
                span.set_attribute("blade.outcome", "success")
            elif isinstance(outcome, ToolSkipped):
                span.set_attribute("blade.outcome", "skipped")
            elif isinstance(outcome, ToolPending):
                span.set_attribute("blade.outcome", "pending")
                span.set_attribute("blade.action_id", outcome.action.action_id)
            elif isinstance(outcome, ToolError):
                code = outcome.code.value
                span.set_attribute("blade.outcome", "error")
                span.set_attribute("error.type", code)
                span.set_status(Status(StatusCode.ERROR, code))
                attributes["error.type"] = code
            span.end()
            if token is not None:  # another task's token fails: the span is ended all the same
                with contextlib.suppress(Exception):
                    otel_context.detach(token)
            self._duration.record(time.perf_counter() - began, attributes)
        except Exception as error:
            log.warning("telemetry: %s (call %s): %r", event.call.name, event.call.call_id, error)

    def _start(self, event: Lifecycle, entry: str, parent: Any) -> None:
        call = event.call
        span = self._tracer.start_span(
            f"execute_tool {call.name}",
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.call_id,
                "gen_ai.tool.description": event.spec.description,
                "gen_ai.tool.type": "function",
                "blade.spec_id": event.spec_id,
                "blade.run_id": call.run_id,
                "blade.side_effect": event.side_effect,
                "blade.kind": event.kind or "",
                "blade.entry": entry,
                **({"blade.parent_call_id": call.parent} if call.parent else {}),
            },
        )
        # Current in the call's task (observers run in it): the implementation's own spans
        # are children of this one.
        token = otel_context.attach(trace.set_span_in_context(span))
        self._open[call.call_id] = (span, token, time.perf_counter())

    def _event(self, event: Lifecycle, name: str) -> None:
        opened = self._open.get(event.call.call_id)
        if opened is None:
            return
        attributes = {
            key: value
            for key, value in (
                ("blade.decision", event.decision),
                ("blade.reason", event.reason),
                ("blade.action_id", event.action_id),
            )
            if value is not None
        }
        opened[0].add_event(name, attributes)
