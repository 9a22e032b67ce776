"""Call benchmark: the cost of a full runtime call against the bare validation it performs.

For a small, a medium (12 fields, nested objects and arrays, enum, pattern) and a large schema
(about 60 fields, shared definitions, oneOf), measured in this run:
  - bare: the chosen validator (jsonschema-rs, compiled once) on the input and on the output;
  - the card's validator, `jsonschema` (Draft202012Validator, built once), on the same instances,
    which is why the runtime does not use it;
  - a full `Runtime.call` of a trivial implementation that returns a prebuilt output: input
    validation, the typed input model, execution, output serialization and validation, the result;
  - the same with an implementation that reads a field of `ctx.input`.
Target: a full call costs at most 4x the bare validation of its input and output; a medium call
runs in well under 100 microseconds.

Then the workload the peers were measured on (bench/workload/: a copy of the medium tool of
../shared/bench/), side by side in this run:
  (each measured in turns with the others, the best of 7 rounds)
  - dict arguments against the same arguments as JSON text, as a model sends them (target: text
    at most 1.25x dict), each with a trivial implementation and with one that reads
    ``ctx.input`` (target: at most 1.25x the floor: validation of input and output and the typed
    input, timed in the same rounds);
  - the invalid payload (three violations, each named in the message) against the valid call
    (target: no dearer);
  - the call reading ``ctx.input`` with an ``allow`` permission policy and one lifecycle
    observer, against the same call without them (target: at most 1.2x);
  - the same call of a registration with a projection, an ``enabled`` callback and one
    capability, against the same call without them (target: at most 1.2x);
  - the call reading ``ctx.input`` traced by ``blade_runtime.otel`` on the OpenTelemetry SDK
    (spans made, no exporter), against the same call untraced (target: at most 1.15x).

Times are this process's CPU time (``time.process_time``), not wall time: every run is one
thread doing only the measured work, and on a shared machine the wall clock also counts the
moments another process had the core.

Usage: python bench/call.py [--calls N]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import jsonschema_rs

from blade_codegen.build import build
from blade_runtime.core.capabilities import shared
from blade_runtime.core.observers import Lifecycle
from blade_runtime.core.permissions import ALLOW, Allow, PermissionRequest
from blade_runtime.runtime import Runtime

WORKLOAD = Path(__file__).resolve().parent / "workload"

SMALL_IN = {
    "type": "object",
    "properties": {
        "q": {"type": "string"},
        "limit": {"type": "integer"},
        "exact": {"type": "boolean"},
    },
    "required": ["q"],
}
SMALL_OUT = {
    "type": "object",
    "properties": {"count": {"type": "integer"}, "first": {"type": "string"}},
    "required": ["count"],
}

ADDRESS = {
    "type": "object",
    "properties": {
        "street": {"type": "string"},
        "city": {"type": "string"},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
    },
    "required": ["city", "zip"],
}
LINE = {
    "type": "object",
    "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"},
        "qty": {"type": "integer", "minimum": 1},
        "price": {"type": "number", "minimum": 0},
    },
    "required": ["sku", "qty", "price"],
}
MEDIUM_IN = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^ord_[a-z0-9]+$"},
        "customer": {"type": "string", "minLength": 1},
        "email": {"type": "string", "format": "email"},
        "priority": {"type": "string", "enum": ["low", "normal", "high", "urgent"]},
        "express": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 10},
        "shipping": ADDRESS,
        "billing": ADDRESS,
        "lines": {"type": "array", "items": LINE, "minItems": 1},
        "discount": {"type": "number", "minimum": 0, "maximum": 1},
        "note": {"type": ["string", "null"], "maxLength": 500},
        "attempt": {"type": "integer", "minimum": 0},
    },
    "required": ["order_id", "customer", "priority", "shipping", "lines"],
    "additionalProperties": False,
}
MEDIUM_OUT = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "status": {"type": "string", "enum": ["accepted", "queued", "rejected"]},
        "total": {"type": "number"},
        "eta_days": {"type": "integer", "minimum": 0},
        "warnings": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["order_id", "status", "total"],
}


def large_in() -> dict[str, Any]:
    properties: dict[str, Any] = {
        f"field_{i}": [
            {"type": "string", "maxLength": 80},
            {"type": "integer", "minimum": 0},
            {"type": "number"},
            {"type": "boolean"},
            {"type": "string", "enum": ["a", "b", "c", "d"]},
        ][i % 5]
        for i in range(50)
    }
    properties["address"] = {"$ref": "#/$defs/Address"}
    properties["lines"] = {"type": "array", "items": {"$ref": "#/$defs/Line"}}
    properties["payment"] = {
        "oneOf": [
            {
                "type": "object",
                "properties": {"kind": {"const": "card"}, "last4": {"type": "string"}},
                "required": ["kind", "last4"],
            },
            {
                "type": "object",
                "properties": {"kind": {"const": "iban"}, "iban": {"type": "string"}},
                "required": ["kind", "iban"],
            },
        ]
    }
    return {
        "type": "object",
        "$defs": {"Address": ADDRESS, "Line": LINE},
        "properties": properties,
        "required": [f"field_{i}" for i in range(0, 50, 2)] + ["address", "lines", "payment"],
    }


def large_instance() -> dict[str, Any]:
    values = ["text", 7, 2.5, True, "c"]
    instance: dict[str, Any] = {f"field_{i}": values[i % 5] for i in range(50)}
    instance["address"] = {"street": "Main 1", "city": "Lyon", "zip": "69001"}
    instance["lines"] = [{"sku": f"ABC-{i}", "qty": i + 1, "price": 9.5} for i in range(8)]
    instance["payment"] = {"kind": "iban", "iban": "DE89370400440532013000"}
    return instance


MEDIUM_INSTANCE = {
    "order_id": "ord_42",
    "customer": "Ann Lee",
    "email": "ann@example.com",
    "priority": "high",
    "express": True,
    "tags": ["gift", "fragile"],
    "shipping": {"street": "Main 1", "city": "Berlin", "zip": "10115"},
    "billing": {"street": "Side 2", "city": "Berlin", "zip": "10117"},
    "lines": [
        {"sku": "ABC-1", "qty": 2, "price": 3.5},
        {"sku": "XYZ-22", "qty": 1, "price": 19.0},
    ],
    "discount": 0.1,
    "note": None,
    "attempt": 0,
}

CASES: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "small": (SMALL_IN, SMALL_OUT, {"q": "blue shoes", "limit": 5}, {"count": 3, "first": "x"}),
    "medium": (
        MEDIUM_IN,
        MEDIUM_OUT,
        MEDIUM_INSTANCE,
        {"order_id": "ord_42", "status": "accepted", "total": 24.3, "eta_days": 2},
    ),
    "large": (
        large_in(),
        MEDIUM_OUT,
        large_instance(),
        {"order_id": "o", "status": "queued", "total": 1.0},
    ),
}


def write_specs(root: Path) -> None:
    import json

    for case, (schema_in, schema_out, _, _) in CASES.items():
        spec = {
            "id": f"bench.{case}.v1",
            "name": f"bench_{case}",
            "description": f"The {case} benchmark tool.",
            "sideEffect": "pure",
            "inputSchema": schema_in,
            "outputSchema": schema_out,
        }
        (root / "bench").mkdir(parents=True, exist_ok=True)
        (root / "bench" / f"{case}.v1.json").write_text(json.dumps(spec))
    (root / "cal").mkdir(parents=True, exist_ok=True)
    (root / "cal" / "schedule.v1.json").write_text((WORKLOAD / "schedule.v1.json").read_text())
    # The same tool declaring one capability, for the dynamic-registration measurement.
    with_capability = json.loads((WORKLOAD / "schedule.v1.json").read_text())
    with_capability.update(id="cal.schedule-clocked.v1", name="schedule_clocked")
    with_capability["capabilities"] = {"clock": {"description": "The time source."}}
    (root / "cal" / "schedule-clocked.v1.json").write_text(json.dumps(with_capability))


def validate_both(
    validate_in: Any, validate_out: Any, instance: Any, output: Any
) -> Callable[[], object]:
    return lambda: validate_in.is_valid(instance) and validate_out.is_valid(output)


def per_call_us(run: Callable[[], object], calls: int) -> float:
    """Best of 5 rounds of ``calls`` calls, in microseconds per call."""
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(calls):
            run()
        best = min(best, time.process_time() - start)
    return best / calls * 1e6


async def per_await_us(runtime: Runtime, name: str, arguments: dict[str, Any], calls: int) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(calls):
            result = await runtime.call(name, arguments)
        best = min(best, time.process_time() - start)
        assert result.status == "success", result
    return best / calls * 1e6


async def measure(calls: int) -> None:
    print(
        f"{'schema':<8} {'bare in+out':>12} {'jsonschema':>12} {'full call':>11} {'ratio':>7}"
        f" {'reads input':>12} {'ratio':>7}"
    )
    for case, (_, _, instance, output_json) in CASES.items():
        module = importlib.import_module(f"blade_bench.bench.{case}_v1")
        spec = module.SPEC
        output = spec.output_type.model_validate(output_json)

        async def trivial(ctx: Any, output: Any = output) -> Any:
            return output

        async def reads_input(ctx: Any, output: Any = output) -> Any:
            ctx.input.model_fields_set  # noqa: B018 - touch the typed input
            return output

        runtime = Runtime()
        runtime.register(spec, trivial)
        runtime.register(spec, reads_input, name=f"{spec.name}_reads")

        rs_in = jsonschema_rs.Draft202012Validator(spec.input_schema)
        rs_out = jsonschema_rs.Draft202012Validator(spec.output_schema)
        py_in = jsonschema.Draft202012Validator(spec.input_schema)
        py_out = jsonschema.Draft202012Validator(spec.output_schema)
        assert rs_in.is_valid(instance) and rs_out.is_valid(output_json)
        bare = per_call_us(validate_both(rs_in, rs_out, instance, output_json), calls)
        card = per_call_us(
            validate_both(py_in, py_out, instance, output_json), max(calls // 50, 20)
        )
        full = await per_await_us(runtime, spec.name, instance, calls)
        reading = await per_await_us(runtime, f"{spec.name}_reads", instance, calls)
        print(
            f"{case:<8} {bare:>10.2f}us {card:>10.1f}us {full:>9.2f}us {full / bare:>6.1f}x"
            f" {reading:>10.2f}us {reading / bare:>6.1f}x"
        )
    print("ratio: full call / bare validation of input and output (target <= 4x)")


class Observer:
    """One lifecycle observer with every boundary (what an audit log would register)."""

    def __init__(self) -> None:
        self.seen = 0

    async def _seen(self, event: Lifecycle) -> None:
        self.seen += 1

    scheduled = permission_requested = permission_resolved = _seen
    execution_started = settled = _seen


def allow(request: PermissionRequest) -> Allow:
    return ALLOW


async def interleaved(
    runs: dict[str, tuple[Runtime, str, Any]], calls: int, floor: Any = None
) -> dict[str, float]:
    """Microseconds per call of each run: the best of 7 rounds, the runs taking turns within
    each round, so that a busy moment of the machine hits all of them alike. ``floor``: a
    function timed in each round too, as ``"floor"``."""
    best = dict.fromkeys([*runs, "floor"], float("inf"))
    for _ in range(7):
        if floor is not None:
            start = time.process_time()
            for _ in range(calls):
                floor()
            best["floor"] = min(best["floor"], (time.process_time() - start) / calls * 1e6)
        for label, (runtime, name, arguments) in runs.items():
            start = time.process_time()
            for _ in range(calls):
                result = await runtime.call(name, arguments)
            elapsed = (time.process_time() - start) / calls * 1e6
            assert result.status == ("error" if label.startswith("invalid") else "success"), result
            best[label] = min(best[label], elapsed)
    return best


def mandated_work(registration: Any, arguments: Any, output: Any) -> Any:
    """What every call must do, as one function: the input validated against its schema, the
    typed input built, the output serialized and validated against its schema."""
    validate_in = registration.input_validator.is_valid
    build_input = registration.build_input
    serialize = registration.output_adapter.serializer.to_python
    validate_out = registration.output_validator.is_valid

    def work() -> None:
        assert validate_in(arguments)
        build_input(arguments)
        content = serialize(output, mode="json", by_alias=True, exclude_unset=True)
        assert validate_out(content)

    return work


async def measure_workload(calls: int) -> None:
    import json

    module = importlib.import_module("blade_bench.cal.schedule_v1")
    payloads = json.loads((WORKLOAD / "schedule.v1.payloads.json").read_text())
    arguments = payloads["valid"]
    invalid = payloads["invalid"]
    text = json.dumps(arguments)
    output = module.ScheduleOutput(ok=True, title=arguments["title"])

    async def trivial(ctx: Any) -> Any:
        return output

    async def reads_input(ctx: Any) -> Any:
        ctx.input.title  # noqa: B018 - touch the typed input
        return output

    plain = Runtime()
    plain.register(module.SPEC, trivial)
    plain.register(module.SPEC, reads_input, name="reads")
    guarded = Runtime(permission=allow)
    guarded.register(module.SPEC, reads_input, name="reads")
    guarded.observe(Observer())
    clocked = importlib.import_module("blade_bench.cal.schedule_clocked_v1")
    dynamic = Runtime(capabilities={"clock": shared(time)})
    dynamic.register(
        clocked.SPEC,
        reads_input,
        name="reads",
        project=lambda out: f"Scheduled {out.title}.",
        enabled=lambda call: call.run_id != "frozen",
    )

    # Traced: blade_runtime.otel on the OpenTelemetry SDK, spans sampled and dropped (no
    # exporter), as an application that configured tracing pays for it before export.
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    from blade_runtime.otel import Telemetry

    traced = Runtime()
    traced.register(module.SPEC, reads_input, name="reads")
    traced.observe(Telemetry(tracer_provider=TracerProvider(), meter_provider=MeterProvider()))

    runs = {
        "dict": (plain, "schedule", arguments),
        "traced": (traced, "reads", arguments),
        "text": (plain, "schedule", text),
        "reads": (plain, "reads", arguments),
        "reads_text": (plain, "reads", text),
        "invalid": (plain, "reads", invalid),
        "policy": (guarded, "reads", arguments),
        "dynamic": (dynamic, "reads", arguments),
    }
    work = mandated_work(plain.registration_of(module.SPEC.id), arguments, output)
    best = await interleaved(runs, calls, work)
    floor = best["floor"]
    as_dict, as_text, reads = best["dict"], best["text"], best["reads"]
    reads_text, with_policy, with_dynamic = best["reads_text"], best["policy"], best["dynamic"]
    invalid_us = best["invalid"]
    print()
    print("the peers' medium tool (cal.schedule.v1):")
    print(f"  dict arguments             {as_dict:8.2f} us")
    print(f"  JSON text arguments        {as_text:8.2f} us  {as_text / as_dict:5.2f}x dict")
    print(f"  the floor: validation in and out, typed input {floor:8.2f} us")
    print(
        f"  dict, reading ctx.input    {reads:8.2f} us  {reads / floor:5.2f}x the floor "
        "(target <= 1.25x)"
    )
    print(
        f"  text, reading ctx.input    {reads_text:8.2f} us  {reads_text / reads:5.2f}x dict "
        "(target <= 1.25x)"
    )
    print(
        f"  invalid dict arguments     {invalid_us:8.2f} us  {invalid_us / reads:5.2f}x the valid "
        "call (target <= 1x)"
    )
    print(
        f"  + allow policy, observer   {with_policy:8.2f} us  {with_policy / reads:5.2f}x "
        "without them (<= 1.2x)"
    )
    print(
        f"  + projection, enabled      {with_dynamic:8.2f} us  {with_dynamic / reads:5.2f}x "
        "without them (<= 1.2x)"
    )
    traced_us = best["traced"]
    print(
        f"  + OpenTelemetry (SDK, no exporter) {traced_us:8.2f} us  {traced_us / reads:5.2f}x "
        "without it (target <= 1.15x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_specs(root / "specs")
        build(root / "specs", root / "out", "blade_bench")
        sys.path.insert(0, str(root / "out"))
        asyncio.run(measure(args.calls))
        asyncio.run(measure_workload(args.calls))


if __name__ == "__main__":
    main()
