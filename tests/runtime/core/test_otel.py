"""OpenTelemetry for every call (blade_runtime.otel), read by the SDK's in-memory exporter and
metric reader as an application's exporter would: the GenAI conventions' span and duration, the
outcome of each entry, and one trace from a call through its answer on another runtime."""

from __future__ import annotations

import asyncio
import importlib
import logging
from pathlib import Path
from typing import Any

import pytest
from conftest import _import_package, add_spec, spec
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from blade_codegen.build import build
from blade_runtime import ResumeEntry, Runtime
from blade_runtime.otel import TRACE_KEY, CallLogFilter, Telemetry
from blade_runtime.stores.sqlite import SQLiteStore

OBJECT = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("otel")
    add_spec(
        root / "specs",
        spec("ops.count.v1", description="Counts to n.", inputSchema=OBJECT, outputSchema=OBJECT),
    )
    add_spec(
        root / "specs",
        spec(
            "ops.approve.v1",
            inputSchema=OBJECT,
            outputSchema=OBJECT,
            sideEffect="non_idempotent",
            suspend={
                "review": {
                    "suspendSchema": {"type": "object"},
                    "resumeSchema": {
                        "type": "object",
                        "properties": {"ok": {"type": "boolean"}},
                        "required": ["ok"],
                    },
                }
            },
        ),
    )
    build(root / "specs", root / "out", "otel_pkg")
    _import_package(root / "out", "otel_pkg")
    return (
        importlib.import_module("otel_pkg.ops.count_v1"),
        importlib.import_module("otel_pkg.ops.approve_v1"),
    )


class Recorded:
    """A tracer and a meter provider of the SDK, each with its in-memory reader."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracing = TracerProvider()
        self.tracing.add_span_processor(SimpleSpanProcessor(self.spans))
        self.metrics = InMemoryMetricReader()
        self.metering = MeterProvider(metric_readers=[self.metrics])

    def telemetry(self, **options: Any) -> Telemetry:
        return Telemetry(tracer_provider=self.tracing, meter_provider=self.metering, **options)

    def durations(self) -> list[Any]:
        return self.points("gen_ai.execute_tool.duration")

    def points(self, name: str) -> list[Any]:
        data = self.metrics.get_metrics_data()
        return [
            point
            for resource in (data.resource_metrics if data else ())
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == name
            for point in metric.data.data_points
        ]


def test_a_call_is_a_genai_tool_span_with_the_implementations_spans_inside(tools: Any) -> None:
    count, _ = tools
    seen = Recorded()
    inner = seen.tracing.get_tracer("app")

    async def run(ctx: Any) -> Any:
        with inner.start_as_current_span("the tool's own work"):
            if ctx.input.n < 0:
                ctx.fail("n must not be negative")
            return count.SPEC.output_type(n=ctx.input.n)

    async def scenario() -> tuple[Any, Any]:
        runtime = Runtime()
        runtime.register(count.SPEC, run)
        runtime.observe(seen.telemetry())
        ok = await runtime.call("count", {"n": 3}, call_id="c-ok", run_id="r-1")
        failed = await runtime.call("count", {"n": -1}, call_id="c-bad", run_id="r-1")
        return ok, failed

    ok, failed = asyncio.run(scenario())
    assert ok.status == "success" and failed.status == "error"
    spans = {s.name: s for s in seen.spans.get_finished_spans() if s.name != "the tool's own work"}
    own = [s for s in seen.spans.get_finished_spans() if s.name == "the tool's own work"]
    tool_spans = [s for s in seen.spans.get_finished_spans() if s.name == "execute_tool count"]
    assert set(spans) == {"execute_tool count"} and len(tool_spans) == 2
    good, bad = sorted(tool_spans, key=lambda s: s.attributes["gen_ai.tool.call.id"] != "c-ok")
    assert dict(good.attributes) | {} == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "count",
        "gen_ai.tool.call.id": "c-ok",
        "gen_ai.tool.description": "Counts to n.",
        "gen_ai.tool.type": "function",
        "blade.spec_id": "ops.count.v1",
        "blade.run_id": "r-1",
        "blade.side_effect": "non_idempotent",
        "blade.kind": "",
        "blade.entry": "initial",
        "blade.outcome": "success",
    }
    assert bad.attributes["error.type"] == "TOOL_FAILED"
    assert bad.status.status_code == trace.StatusCode.ERROR
    # The implementation's own spans are children of its call's span, in the same trace.
    assert len(own) == 2 and {s.parent.span_id for s in own if s.parent} == {
        good.context.span_id,
        bad.context.span_id,
    }
    durations = seen.durations()
    assert sorted(p.count for p in durations) == [1, 1]
    assert {p.attributes.get("error.type") for p in durations} == {None, "TOOL_FAILED"}


def test_one_trace_from_a_call_through_its_answer_on_another_runtime(
    tools: Any, tmp_path: Path
) -> None:
    """The call suspends on one runtime; a person's answer resumes it on another (its own
    process's telemetry, the same store): the resumed entry's span is a child of the first,
    in the same trace, as the stored traceparent says."""
    _, approve = tools
    first, second = Recorded(), Recorded()

    async def run(ctx: Any) -> Any:
        if isinstance(ctx.entry, ResumeEntry):
            return approve.SPEC.output_type(n=ctx.input.n if ctx.entry.payload.ok else 0)
        ctx.suspend("review", approve.ApproveReviewSuspend())

    async def scenario() -> Any:
        store = SQLiteStore(tmp_path / "otel.db")
        asking = Runtime(store=store)
        asking.register(approve.SPEC, run)
        asking.observe(first.telemetry())
        waiting = await asking.call("approve", {"n": 5}, call_id="c-wait", run_id="r-2")
        await asking.close()
        record = store.call("c-wait")
        answering = Runtime(store=SQLiteStore(tmp_path / "otel.db"))
        answering.register(approve.SPEC, run)
        answering.observe(second.telemetry())
        done = await answering.submit(waiting.action.action_id, {"ok": True})
        await answering.close()
        store.close()
        return waiting, record, done

    waiting, record, done = asyncio.run(scenario())
    assert waiting.status == "pending" and done.status == "success"
    assert record is not None and TRACE_KEY in record.context["extra"]
    [asked] = first.spans.get_finished_spans()
    [resumed] = second.spans.get_finished_spans()
    assert asked.attributes["blade.outcome"] == "pending"
    assert asked.attributes["blade.action_id"] == waiting.action.action_id
    assert resumed.attributes["blade.entry"] == "re-entry"
    assert resumed.attributes["blade.outcome"] == "success"
    assert resumed.context.trace_id == asked.context.trace_id
    assert resumed.parent is not None and resumed.parent.span_id == asked.context.span_id


def test_a_call_over_http_continues_the_trace_its_request_carries(example_package: Any) -> None:
    import httpx
    from http_support import ALICE, authenticate, runtime_of

    from blade_runtime.serving.http import create_app

    seen = Recorded()
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"

    async def scenario() -> tuple[int, int]:
        runtime, _ = runtime_of()
        runtime.observe(seen.telemetry())
        app = create_app(runtime, authenticate=authenticate)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            carried = await http.post(
                "/v1/tools/lookup_customer/calls",
                json={"email": "ann@example.com"},
                headers={**ALICE, "traceparent": f"00-{trace_id}-{parent_id}-01"},
            )
            forged = await http.post(
                "/v1/tools/lookup_customer/calls",
                json={"email": "bob@example.com"},
                headers={**ALICE, "traceparent": "not-a-trace-context"},
            )
        return carried.status_code, forged.status_code

    assert asyncio.run(scenario()) == (200, 200)
    carried, fresh = sorted(
        seen.spans.get_finished_spans(), key=lambda s: s.parent is None
    )  # the carried one has a parent
    assert format(carried.context.trace_id, "032x") == trace_id
    assert carried.parent is not None and format(carried.parent.span_id, "016x") == parent_id
    assert fresh.parent is None and format(fresh.context.trace_id, "032x") != trace_id


def test_a_refused_call_is_an_instant_span_with_its_code_and_counted(tools: Any) -> None:
    count, _ = tools
    seen = Recorded()

    async def run(ctx: Any) -> Any:
        return count.SPEC.output_type(n=ctx.input.n)

    async def scenario() -> list[Any]:
        runtime = Runtime()
        runtime.register(count.SPEC, run)
        runtime.observe(seen.telemetry())
        return [
            await runtime.call("count", {"n": "three"}, call_id="c-invalid"),
            await runtime.call("nowhere", {}, call_id="c-unknown"),
            await runtime.call("count", "{not json", call_id="c-text"),
            await runtime.call("count", {"n": 1}, call_id="c-fine"),
        ]

    results = asyncio.run(scenario())
    assert [r.status for r in results] == ["error", "error", "error", "success"]
    spans = {s.attributes["gen_ai.tool.call.id"]: s for s in seen.spans.get_finished_spans()}
    assert set(spans) == {"c-invalid", "c-unknown", "c-text", "c-fine"}
    for call_id, code in [
        ("c-invalid", "INVALID_INPUT"),
        ("c-unknown", "TOOL_HANDLER_NOT_FOUND"),
        ("c-text", "INVALID_INPUT"),
    ]:
        span = spans[call_id]
        assert span.attributes["blade.outcome"] == "refused", call_id
        assert span.attributes["blade.entry"] == "refused"
        assert span.attributes["error.type"] == code
        assert span.status.status_code == trace.StatusCode.ERROR
    counted = {
        (p.attributes["blade.outcome"], p.attributes.get("error.type")): p.value
        for p in seen.points("blade.tool.calls")
    }
    assert counted == {
        ("refused", "INVALID_INPUT"): 2,
        ("refused", "TOOL_HANDLER_NOT_FOUND"): 1,
    } | {("success", None): 1}
    # The model's arguments are nowhere in a span unless the application opts in.
    assert all("three" not in str(dict(s.attributes)) for s in spans.values())


def test_metrics_of_a_store_pending_actions_resumes_and_store_operations(
    tools: Any, tmp_path: Path
) -> None:
    _, approve = tools
    seen = Recorded()

    async def run(ctx: Any) -> Any:
        if isinstance(ctx.entry, ResumeEntry):
            return approve.SPEC.output_type(n=ctx.input.n)
        ctx.suspend("review", approve.ApproveReviewSuspend())

    async def scenario() -> tuple[list[Any], list[Any]]:
        store = SQLiteStore(tmp_path / "metrics.db")
        runtime = Runtime(store=store)
        runtime.register(approve.SPEC, run)
        runtime.observe(seen.telemetry(store=store))
        waiting = [
            await runtime.call("approve", {"n": n}, call_id=f"c-{n}", run_id="r") for n in (1, 2)
        ]
        await asyncio.sleep(0.05)
        before = seen.points("blade.pending.waiting") + seen.points("blade.pending.oldest_age")
        await runtime.submit(waiting[0].action.action_id, {"ok": True})
        after = seen.points("blade.pending.waiting")
        await runtime.close()
        store.close()
        return before, after

    before, after = asyncio.run(scenario())
    waiting_before, oldest = before
    assert waiting_before.value == 2 and 0.05 <= oldest.value < 60
    assert [p.value for p in after] == [1]
    [resumed] = seen.points("blade.tool.resumes")
    assert resumed.value == 1 and resumed.attributes["gen_ai.tool.name"] == "approve"
    counted = {p.attributes["blade.outcome"]: p.value for p in seen.points("blade.tool.calls")}
    assert counted == {"pending": 2, "success": 1}
    operations = {
        p.attributes["blade.store.operation"]: p
        for p in seen.points("blade.store.operation.duration")
    }
    assert {"begin", "suspend", "resolve", "settle"} <= set(operations)
    assert all(p.count >= 1 and p.sum >= 0 for p in operations.values())


def test_a_call_another_worker_took_over_is_a_lease_loss(tools: Any, tmp_path: Path) -> None:
    count, _ = tools
    seen = Recorded()

    async def run(ctx: Any) -> Any:
        await asyncio.sleep(5)  # stopped by the heartbeat long before
        return count.SPEC.output_type(n=ctx.input.n)

    async def scenario() -> Any:
        runtime = Runtime(store=SQLiteStore(tmp_path / "lost.db"), lease_s=0.6)
        runtime.register(count.SPEC, run)
        runtime.observe(seen.telemetry())
        call = asyncio.create_task(runtime.call("count", {"n": 1}, call_id="c-lost"))
        await asyncio.sleep(0.3)
        thief = SQLiteStore(tmp_path / "lost.db")
        [taken] = thief.claim("thief", 30.0, dead={runtime.owner}, call_id="c-lost")
        result = await asyncio.wait_for(call, 30)
        thief.close()
        await runtime.close()
        return taken, result

    taken, result = asyncio.run(scenario())
    assert taken.call.owner == "thief"
    assert result.status == "error" and result.code.value == "LEASE_LOST"
    [lost] = seen.points("blade.lease.losses")
    assert lost.value == 1 and lost.attributes == {"gen_ai.tool.name": "count"}


def test_log_records_inside_a_call_carry_its_ids_and_its_trace(tools: Any) -> None:
    count, _ = tools
    seen = Recorded()
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    handler.addFilter(CallLogFilter())
    app_log = logging.getLogger("otel-test-app")
    app_log.addHandler(handler)
    app_log.setLevel(logging.INFO)

    async def run(ctx: Any) -> Any:
        app_log.info("counting")
        return count.SPEC.output_type(n=ctx.input.n)

    async def scenario() -> None:
        runtime = Runtime()
        runtime.register(count.SPEC, run)
        runtime.observe(seen.telemetry())
        await runtime.call("count", {"n": 1}, call_id="c-log", run_id="r-log")
        app_log.info("between calls")

    try:
        asyncio.run(scenario())
    finally:
        app_log.removeHandler(handler)
    inside, outside = records
    [span] = seen.spans.get_finished_spans()
    assert (inside.call_id, inside.run_id) == ("c-log", "r-log")  # type: ignore[attr-defined]
    assert inside.trace_id == format(span.context.trace_id, "032x")  # type: ignore[attr-defined]
    assert inside.span_id == format(span.context.span_id, "016x")  # type: ignore[attr-defined]
    assert (outside.call_id, outside.trace_id) == ("", "")  # type: ignore[attr-defined]


def test_content_and_tenant_are_recorded_only_when_the_application_opts_in(tools: Any) -> None:
    from blade_runtime import CallContext, Principal

    count, _ = tools
    context = CallContext(principal=Principal("ann", "acme"))
    spans = []
    for options in ({}, {"record_content": True, "record_tenant": True}):
        seen = Recorded()

        async def run(ctx: Any) -> Any:
            return count.SPEC.output_type(n=ctx.input.n)

        async def scenario(seen: Recorded = seen, options: dict[str, Any] = options) -> None:
            runtime = Runtime()
            runtime.register(count.SPEC, run)
            runtime.observe(seen.telemetry(**options))
            await runtime.call("count", {"n": 41}, call_id="c-content", context=context)

        asyncio.run(scenario())
        [span] = seen.spans.get_finished_spans()
        spans.append(dict(span.attributes))
    plain, opted = spans
    assert not {"gen_ai.tool.call.arguments", "gen_ai.tool.call.result", "blade.tenant"} & set(
        plain
    )
    assert "41" not in str(plain) and "acme" not in str(plain)
    assert opted["gen_ai.tool.call.arguments"] == '{"n":41}'
    assert '"n":41' in opted["gen_ai.tool.call.result"]
    assert opted["blade.tenant"] == "acme"


def test_an_mcp_clients_trace_context_in_meta_is_continued(tools: Any) -> None:
    from mcp import Client

    from blade_runtime.serving.mcp import mcp_server

    count, _ = tools
    seen = Recorded()
    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"

    async def run(ctx: Any) -> Any:
        return count.SPEC.output_type(n=ctx.input.n)

    async def scenario() -> None:
        runtime = Runtime()
        runtime.register(count.SPEC, run)
        runtime.observe(seen.telemetry())
        async with Client(mcp_server(runtime)) as client:
            carried = f"00-{trace_id}-{parent_id}-01"
            await client.call_tool("count", {"n": 1}, meta={"traceparent": carried})
            await client.call_tool("count", {"n": 2}, meta={"traceparent": "garbage"})

    asyncio.run(scenario())
    carried, fresh = sorted(seen.spans.get_finished_spans(), key=lambda s: s.parent is None)
    assert format(carried.context.trace_id, "032x") == trace_id
    assert carried.parent is not None and format(carried.parent.span_id, "016x") == parent_id
    assert fresh.parent is None and format(fresh.context.trace_id, "032x") != trace_id


def test_a_replay_after_its_worker_died_is_in_the_calls_trace(tmp_path: Path) -> None:
    """The worker that began the call stops renewing its lease (as a killed one does); another
    worker's recovery replays the idempotent call: its span continues the first one's trace."""
    root = tmp_path / "replay"
    add_spec(
        root / "specs",
        spec("ops.fetch.v1", inputSchema=OBJECT, outputSchema=OBJECT, sideEffect="idempotent"),
    )
    build(root / "specs", root / "out", "otel_replay_pkg")
    _import_package(root / "out", "otel_replay_pkg")
    fetch = importlib.import_module("otel_replay_pkg.ops.fetch_v1")
    first, second = Recorded(), Recorded()
    release = asyncio.Event()

    async def stuck(ctx: Any) -> Any:
        await release.wait()
        return fetch.SPEC.output_type(n=ctx.input.n)

    async def quick(ctx: Any) -> Any:
        return fetch.SPEC.output_type(n=ctx.input.n)

    async def scenario() -> list[Any]:
        dying = Runtime(store=SQLiteStore(tmp_path / "replay.db"), lease_s=0.5)
        dying.register(fetch.SPEC, stuck)
        dying.observe(first.telemetry())
        started = asyncio.create_task(dying.call("fetch", {"n": 2}, call_id="c-replayed"))
        await asyncio.sleep(0.2)
        dying.leases.close()  # its heartbeat stops: the lease lapses, as a killed worker's
        await asyncio.sleep(1.0)
        survivor = Runtime(store=SQLiteStore(tmp_path / "replay.db"))
        survivor.register(fetch.SPEC, quick)
        survivor.observe(second.telemetry())
        replayed = await survivor.recover()
        release.set()
        await started  # its late result is not recorded
        await survivor.close()
        await dying.close()
        return replayed

    [replayed] = asyncio.run(scenario())
    assert replayed.status == "success"
    [original] = [s for s in first.spans.get_finished_spans()]
    [again] = second.spans.get_finished_spans()
    assert again.attributes["blade.entry"] == "re-entry"
    assert again.context.trace_id == original.context.trace_id
    assert again.parent is not None and again.parent.span_id == original.context.span_id
