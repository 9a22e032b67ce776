"""Property: the call agrees with the JSON Schema, on the example specs and on 312 real MCP tools.

For drawn arguments, an independent validator (``jsonschema`` with ECMA-262 patterns, not the
runtime's jsonschema-rs) decides whether the input schema accepts them. Accepted: the call succeeds
and the implementation receives the generated pydantic model. Rejected: the result is
INVALID_INPUT and the implementation never ran.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import conform, instances, oracle, round_trip, valid_instances

from blade_runtime.core.results import ErrorCode, ToolError, ToolSuccess
from blade_runtime.runtime import Runtime

# Derandomized: the same examples on every run, so CI cannot fail on a draw nobody reproduced
# here. To explore further, raise max_examples or drop derandomize locally.
PROPERTY_SETTINGS = settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class Harness:
    """One runtime per tool; the implementation records the input it received."""

    def __init__(self) -> None:
        self.runtimes: dict[str, Runtime] = {}
        self.received: list[Any] = []
        self.output: Any = None

    def runtime(self, spec: Any, context: Any) -> Runtime:
        if spec.name not in self.runtimes:

            async def implementation(ctx: Any) -> Any:
                self.received.append(ctx.input)
                return self.output

            runtime = Runtime()
            provider = None if context is None else (lambda call: context)
            runtime.register(spec, implementation, context=provider)
            self.runtimes[spec.name] = runtime
        return self.runtimes[spec.name]

    def check(self, spec: Any, output: Any, context: Any, arguments: Any) -> bool:
        """One drawn call: returns whether the schema accepted the arguments."""
        self.received.clear()
        self.output = output
        result = asyncio.run(self.runtime(spec, context).call(spec.name, arguments))
        accepted = oracle(spec.input_schema).is_valid(arguments)
        if accepted:
            assert isinstance(result, ToolSuccess), (arguments, result)
            assert len(self.received) == 1 and isinstance(self.received[0], spec.input_type)
        else:
            assert isinstance(result, ToolError), (arguments, result)
            assert result.code == ErrorCode.INVALID_INPUT, (arguments, result)
            assert self.received == []
        return accepted


def valid_output(spec: Any) -> st.SearchStrategy[Any]:
    """An output the tool's output schema accepts (any JSON when it has none)."""
    if spec.output_schema is None:
        return st.just({})
    validator = oracle(spec.output_schema)
    return conform(spec.output_schema, spec.output_schema, 0).filter(validator.is_valid)


def example_tools(package: Any) -> list[tuple[Any, Any, Any]]:
    from blade_specs.crm import lookup_customer_v1 as lookup
    from blade_specs.deploy import deploy_service_v1 as deploy

    return [
        (
            lookup.SPEC,
            lookup.LookupCustomerOutput(found=False),
            lookup.LookupCustomerContext(tenant_id="t1"),
        ),
        (deploy.SPEC, deploy.DeployServiceOutput(deployed=True, steps=0), None),
    ]


@pytest.mark.parametrize("index", [0, 1], ids=["lookup_customer", "deploy_service"])
def test_example_tools_accept_exactly_what_their_schema_accepts(
    example_package: Any, index: int
) -> None:
    spec, output, context = example_tools(example_package)[index]
    harness = Harness()
    verdicts: list[bool] = []

    @PROPERTY_SETTINGS
    @given(arguments=instances(spec.input_schema))
    def check(arguments: Any) -> None:
        verdicts.append(harness.check(spec, output, context, arguments))

    check()
    assert any(verdicts) and not all(verdicts), "the strategy must reach both verdicts"


def test_every_mcp_corpus_tool_accepts_exactly_what_its_schema_accepts(mcp_package: Any) -> None:
    specs = mcp_package.load_all()
    assert len(specs) == 312
    harness = Harness()
    verdicts: dict[str, list[bool]] = {spec.name: [] for spec in specs}
    # A tool's strategies are made on its first draw, not on every one (the same strategies).
    strategies: dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]] = {}

    @settings(PROPERTY_SETTINGS, max_examples=1500)
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        spec = data.draw(st.sampled_from(specs), label="tool")
        if spec.name not in strategies:
            strategies[spec.name] = (instances(spec.input_schema), valid_output(spec))
        drawn_arguments, drawn_output = strategies[spec.name]
        arguments = data.draw(drawn_arguments, label="arguments")
        output = data.draw(drawn_output, label="output")
        verdicts[spec.name].append(harness.check(spec, output, None, arguments))

    check()
    drawn = [v for vs in verdicts.values() for v in vs]
    assert sum(drawn) > len(drawn) // 4 and not all(drawn), "both verdicts, mostly valid"


def test_models_keep_fifty_valid_instances_of_every_mcp_schema_as_they_were(
    mcp_package: Any,
) -> None:
    """For every input and output schema of the 312 tools, 50 instances drawn from the schema and
    valid by the oracle (distinct, but where a schema has fewer): no false rejection, and a
    round trip that changes nothing (unknown properties of open objects kept, nothing added, no
    key renamed, numbers unchanged)."""
    from pydantic import TypeAdapter

    schemas = 0
    for spec in mcp_package.load_all():
        for slot, schema, kind in (
            ("input", spec.input_schema, spec.input_type),
            ("output", spec.output_schema, spec.output_type),
        ):
            if schema is None:
                continue
            schemas += 1
            adapter = TypeAdapter(kind)
            values = valid_instances(schema, 50)
            assert len(values) == 50, (spec.id, slot)
            for value in values:
                problem = round_trip(adapter, value)
                assert problem is None, (spec.id, slot, value, problem)
    assert schemas == 339
