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

A call refused before it became an invocation (no such tool, invalid arguments, a hook's skip
or abort) is an instant span with its code. Metrics beside the duration: ``blade.tool.calls``
(entries by ``blade.outcome`` and ``error.type``), ``blade.tool.resumes``, ``blade.lease.losses``,
``blade.store.operation.duration`` (each store operation of the runtime, waits included) and,
when the store is given, the gauges ``blade.pending.waiting``, ``blade.pending.oldest_age`` and
``blade.tool.waiting`` (calls waiting for a concurrency slot or a resource lock, by tool).
``CallLogFilter`` puts the running call's ids and the trace's on every log record.

Nothing of a call's content is recorded (arguments, results, error messages, the tenant) unless
the application opts in (``record_content``, ``record_tenant``): they may hold what must not
leave the service.

It is an observer, so a runtime without it pays nothing; it never fails a call (an error of its
own is logged). Spans go where the application's tracer provider sends them (the global one
unless one is given).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from contextvars import ContextVar
from dataclasses import replace
from datetime import datetime
from typing import Any

from blade_runtime.core.caller import CallContext
from blade_runtime.core.observers import Lifecycle, Refusal
from blade_runtime.core.results import ErrorCode, ToolError, ToolPending, ToolSkipped
from blade_runtime.core.store import Store

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics, trace
    from opentelemetry.metrics import CallbackOptions, Observation
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

# The call whose entry runs in this task (its id and run id), for log records.
_running: ContextVar[tuple[str, str] | None] = ContextVar("blade_otel_call", default=None)


class CallLogFilter(logging.Filter):
    """Sets ``call_id``, ``run_id``, ``trace_id`` and ``span_id`` on every record it passes
    (empty outside a traced call; it drops none), so a format such as
    ``"%(levelname)s %(trace_id)s %(call_id)s %(message)s"`` names them and a log backend joins
    a record to its trace. Identifiers only: the runtime's messages carry no arguments, outputs
    or secrets, and this adds none. Install it on a handler (or the ``blade_runtime`` logger)."""

    def filter(self, record: logging.LogRecord) -> bool:
        running = _running.get()
        record.call_id, record.run_id = ("", "") if running is None else running
        context = trace.get_current_span().get_span_context()
        record.trace_id = format(context.trace_id, "032x") if context.is_valid else ""
        record.span_id = format(context.span_id, "016x") if context.is_valid else ""
        return True


class Telemetry:
    """A lifecycle observer that traces and measures calls (see the module's docstring).
    ``tracer_provider`` and ``meter_provider``: the application's, else OpenTelemetry's global
    ones."""

    def __init__(
        self,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        *,
        store: Store | None = None,
        record_content: bool = False,
        record_tenant: bool = False,
    ) -> None:
        self._tracer = trace.get_tracer(_SCOPE, tracer_provider=tracer_provider)
        meter = metrics.get_meter(_SCOPE, meter_provider=meter_provider)
        self._duration = meter.create_histogram(
            "gen_ai.execute_tool.duration",
            unit="s",
            description="How long a tool call's entry ran, from its start to its outcome.",
        )
        self._calls = meter.create_counter(
            "blade.tool.calls",
            unit="{entry}",
            description="Entries of calls by outcome (success, error, skipped, pending, "
            "refused) and error.type.",
        )
        self._resumes = meter.create_counter(
            "blade.tool.resumes",
            unit="{entry}",
            description="Entries that took a call up again (a resume or a replay).",
        )
        self._lease_losses = meter.create_counter(
            "blade.lease.losses",
            unit="{entry}",
            description="Entries stopped because this runtime lost the call's lease.",
        )
        self._store_duration = meter.create_histogram(
            "blade.store.operation.duration",
            unit="s",
            description="How long each store operation of the runtime took, waits included.",
        )
        if store is not None:
            self._waiting_store = store
            meter.create_observable_gauge(
                "blade.pending.waiting",
                [self._waiting],
                unit="{action}",
                description="Pending actions waiting for an answer (every tenant's).",
            )
            meter.create_observable_gauge(
                "blade.pending.oldest_age",
                [self._oldest_age],
                unit="s",
                description="How long the oldest pending action has waited.",
            )
            meter.create_observable_gauge(
                "blade.tool.waiting",
                [self._slot_waiters],
                unit="{call}",
                description="Calls waiting for a concurrency slot or a resource lock, by "
                "gen_ai.tool.name (every worker's, every tenant's).",
            )
        self._record_content = record_content
        self._record_tenant = record_tenant
        # The open entry of each call in this process: its span, the context token that made
        # it current in the call's task, when it began, and the log context's token.
        self._open: dict[str, tuple[Any, Any, float, Any]] = {}

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
            if self._record_content:
                span.set_attribute("gen_ai.tool.call.arguments", _json(event.input))
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
            self._resumes.add(1, {"gen_ai.tool.name": event.call.name})
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
            span, token, began, logged = opened
            attributes = self._outcome(span, event.outcome, event.call.name)
            if self._record_content and not isinstance(event.outcome, ToolPending):
                span.set_attribute("gen_ai.tool.call.result", _json(event.result))
            span.end()
            if token is not None:  # another task's token fails: the span is ended all the same
                with contextlib.suppress(Exception):
                    otel_context.detach(token)
            with contextlib.suppress(Exception):
                _running.reset(logged)
            self._duration.record(time.perf_counter() - began, attributes)
        except Exception as error:
            log.warning("telemetry: %s (call %s): %r", event.call.name, event.call.call_id, error)

    async def refused(self, refusal: Refusal) -> None:
        """A call that never became an invocation: an instant span with its outcome."""
        call = refusal.call
        try:
            description = "" if refusal.spec is None else refusal.spec.description
            span = self._tracer.start_span(
                f"execute_tool {call.name}",
                kind=SpanKind.INTERNAL,
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": call.name,
                    "gen_ai.tool.call.id": call.call_id,
                    "gen_ai.tool.description": description,
                    "gen_ai.tool.type": "function",
                    "blade.spec_id": call.spec_id,
                    "blade.run_id": call.run_id,
                    "blade.entry": "refused",
                    **self._tenant(call),
                },
            )
            self._outcome(span, refusal.outcome, call.name, refused=True)
            span.end()
        except Exception as error:
            log.warning("telemetry: %s (call %s): %r", call.name, call.call_id, error)

    def store_operation(self, name: str, seconds: float) -> None:
        """The runtime's store access tells how long each operation took."""
        self._store_duration.record(seconds, {"blade.store.operation": name})

    def _outcome(self, span: Any, outcome: Any, tool: str, refused: bool = False) -> dict[str, str]:
        """The outcome on the span and in the entries counted; the metric's attributes."""
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool}
        label = "refused" if refused else "success"
        if isinstance(outcome, ToolSkipped):
            label = "refused" if refused else "skipped"
        elif isinstance(outcome, ToolPending):
            label = "pending"
            span.set_attribute("blade.action_id", outcome.action.action_id)
        elif isinstance(outcome, ToolError):
            code = outcome.code.value
            label = "refused" if refused else "error"
            span.set_attribute("error.type", code)
            span.set_status(Status(StatusCode.ERROR, code))
            if self._record_content:
                span.set_attribute("blade.error.message", outcome.message)
            attributes["error.type"] = code
            if outcome.code is ErrorCode.LEASE_LOST:
                self._lease_losses.add(1, {"gen_ai.tool.name": tool})
        span.set_attribute("blade.outcome", label)
        self._calls.add(1, {**attributes, "blade.outcome": label})
        return attributes

    def _tenant(self, call: Any) -> dict[str, str]:
        context = call.context
        principal = None if context is None else context.principal
        if not self._record_tenant or principal is None:
            return {}
        return {"blade.tenant": principal.tenant}

    def _waiting(self, options: CallbackOptions) -> list[Observation]:
        try:
            count, _ = self._waiting_store.waiting()
        except Exception as error:  # the store is down: no point this time
            log.warning("telemetry: pending actions not read: %r", error)
            return []
        return [Observation(count)]

    def _slot_waiters(self, options: CallbackOptions) -> list[Observation]:
        try:
            rows = self._waiting_store.slots()
        except Exception as error:
            log.warning("telemetry: slot queues not read: %r", error)
            return []
        waiting: dict[str, set[str]] = {}
        for row in rows:
            if not row.held:
                waiting.setdefault(row.name, set()).add(row.call_id)
        return [
            Observation(len(calls), {"gen_ai.tool.name": name})
            for name, calls in sorted(waiting.items())
        ]

    def _oldest_age(self, options: CallbackOptions) -> list[Observation]:
        try:
            _, oldest = self._waiting_store.waiting()
        except Exception as error:
            log.warning("telemetry: pending actions not read: %r", error)
            return []
        if oldest is None:
            return [Observation(0.0)]
        return [Observation(max(0.0, time.time() - datetime.fromisoformat(oldest).timestamp()))]

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
                **self._tenant(call),
            },
        )
        # Current in the call's task (observers run in it): the implementation's own spans
        # are children of this one, and its log records name the call.
        token = otel_context.attach(trace.set_span_in_context(span))
        logged = _running.set((call.call_id, call.run_id))
        self._open[call.call_id] = (span, token, time.perf_counter(), logged)

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


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
