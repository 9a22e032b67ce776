"""The runtime's call pipeline: registry, validation, every error code, timeouts, cancellation."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import random
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

import pytest

from blade_runtime import ToolFailed
from blade_runtime.core.results import ErrorCode, ToolError, ToolResult, ToolSkipped, ToolSuccess
from blade_runtime.runtime import PermissionRequest, RegistrationError, Runtime

GOOD = {"service": "api", "version": "v1.2.3", "environment": "staging"}
Impl = Callable[[Any], Awaitable[Any]]


def run(coroutine: Awaitable[ToolResult[Any]]) -> ToolResult[Any]:
    async def main() -> ToolResult[Any]:
        return await coroutine

    return asyncio.run(main())


@pytest.fixture
def lookup(example_package: Any) -> Any:
    from blade_specs.crm import lookup_customer_v1

    return lookup_customer_v1


def deployed(deploy: Any, steps: int = 1) -> Any:
    return deploy.DeployServiceOutput(deployed=True, steps=steps)


def error_of(result: ToolResult[Any], code: ErrorCode) -> ToolError:
    assert isinstance(result, ToolError), result
    assert result.code == code, result
    assert result.content == {"error": code.value, "message": result.message}
    return result


# -- registry ----------------------------------------------------------------------------------


def test_registration_names_default_to_the_spec_and_may_repeat_a_spec(deploy: Any) -> None:
    async def impl(ctx: Any) -> Any:
        return deployed(deploy)

    runtime = Runtime()
    runtime.register(deploy.SPEC, impl)
    runtime.register(deploy.SPEC, impl, name="deploy_again")
    assert [r.name for r in runtime.registrations()] == ["deploy_service", "deploy_again"]
    with pytest.raises(RegistrationError, match=r"already registered for deploy\.deploy-service"):
        runtime.register(deploy.SPEC, impl, name="deploy_again")
    with pytest.raises(RegistrationError, match="a name must match"):
        runtime.register(deploy.SPEC, impl, name="deploy service")
    second = run(runtime.call("deploy_again", GOOD))
    assert isinstance(second, ToolSuccess) and second.call.spec_id == "deploy.deploy-service.v1"


def test_a_spec_with_context_needs_a_provider_at_registration(lookup: Any) -> None:
    async def impl(ctx: Any) -> Any:
        return lookup.LookupCustomerOutput(found=False)

    with pytest.raises(RegistrationError, match="contextSchema, so pass context="):
        Runtime().register(lookup.SPEC, impl)


def test_backend_and_client_specs_register_through_their_own_methods(example_package: Any) -> None:
    from blade_specs.browser import check_page_v1
    from blade_specs.deploy import deploy_service_v1

    async def impl(ctx: Any) -> Any:
        return None

    with pytest.raises(RegistrationError, match=r"a client executes browser\.check-page\.v1"):
        Runtime().register(check_page_v1.SPEC, impl)  # type: ignore[arg-type]
    with pytest.raises(RegistrationError, match="the backend executes it; use register"):
        Runtime().register_client(deploy_service_v1.SPEC)  # type: ignore[arg-type]


def test_allow_and_deny_lists(deploy: Any) -> None:
    async def impl(ctx: Any) -> Any:
        return deployed(deploy)

    def runtime(**lists: Any) -> Runtime:
        rt = Runtime(**lists)
        rt.register(deploy.SPEC, impl)
        rt.register(deploy.SPEC, impl, name="other")
        return rt

    everything = runtime()
    assert run(everything.call("other", GOOD)).status == "success"
    nothing = runtime(allowed=[])
    error_of(run(nothing.call("deploy_service", GOOD)), ErrorCode.TOOL_NOT_ALLOWED)
    assert nothing.export().document == {"tools": []}
    some = runtime(allowed=["deploy_service", "other"], disallowed=["other"])
    assert run(some.call("deploy_service", GOOD)).status == "success"
    error_of(run(some.call("other", GOOD)), ErrorCode.TOOL_NOT_ALLOWED)
    assert [t["name"] for t in some.export().document["tools"]] == ["deploy_service"]  # type: ignore[index,call-overload]


# -- a call ------------------------------------------------------------------------------------


def test_a_call_gives_the_implementation_a_typed_context(lookup: Any) -> None:
    seen: dict[str, Any] = {}

    async def impl(ctx: Any) -> Any:
        seen.update(input=ctx.input, context=ctx.context, call=ctx.call, signal=ctx.signal)
        customer = lookup.Customer(id="cus_1", name="Ann", tier="pro")
        return lookup.LookupCustomerOutput(found=True, customer=customer)

    async def tenant(call: Any) -> Any:
        return lookup.LookupCustomerContext(tenant_id=f"t-{call.run_id}")

    runtime = Runtime()
    runtime.register(lookup.SPEC, impl, context=tenant)
    result = run(
        runtime.call("lookup_customer", '{"customer_id": "cus_1"}', call_id="c1", run_id="r1")
    )
    assert isinstance(result, ToolSuccess)
    assert isinstance(seen["input"], lookup.LookupCustomerInput)
    assert seen["input"].customer_id == "cus_1"
    assert seen["context"].tenant_id == "t-r1"
    assert (seen["call"].call_id, seen["call"].run_id) == ("c1", "r1")
    assert not seen["signal"].cancelled
    assert isinstance(result.output, lookup.LookupCustomerOutput)
    # Unset optional fields stay out of the model-facing JSON: nothing is invented.
    assert result.content == {
        "found": True,
        "customer": {"id": "cus_1", "name": "Ann", "tier": "pro"},
    }


def test_invalid_input_names_every_path_and_what_was_expected(deploy: Any) -> None:
    ran = []

    async def impl(ctx: Any) -> Any:
        ran.append(ctx)
        return deployed(deploy)

    runtime = Runtime()
    runtime.register(deploy.SPEC, impl)
    bad = {"service": "", "version": "1.2", "environment": "prod", "canary_percent": "x", "y": 1}
    error = error_of(run(runtime.call("deploy_service", bad)), ErrorCode.INVALID_INPUT)
    for fragment in (
        'at /environment: must be one of "staging", "production" (got "prod")',
        "at /version: must match the pattern ^v[0-9]+\\.[0-9]+\\.[0-9]+$",
        "at /canary_percent: must be of type integer (got string)",
        'at the top level: unexpected property "y"',
        "at /service:",
    ):
        assert fragment in error.message
    missing = error_of(run(runtime.call("deploy_service", {})), ErrorCode.INVALID_INPUT)
    assert 'the required property "service" is missing' in missing.message
    not_json = error_of(run(runtime.call("deploy_service", "{service")), ErrorCode.INVALID_INPUT)
    assert "not valid JSON" in not_json.message
    error_of(run(runtime.call("deploy_service", "[1, 2]")), ErrorCode.INVALID_INPUT)
    assert ran == []


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "arguments, said",
    [
        ({**GOOD, "\ud800": 1}, "not valid Unicode"),
        (
            {**GOOD, "service": "api", "environment": "staging", "x\udc00y": "z"},
            "not valid Unicode",
        ),
        ({**GOOD, "canary_percent": nested(400)}, "nested too deeply"),
        ({**GOOD, "canary_percent": nested(5000)}, "nested too deeply"),
    ],
    ids=["surrogate-key", "surrogate-key-among-others", "deep-400", "deep-5000"],
)
def test_arguments_no_json_text_could_carry_are_invalid_input_not_an_exception(
    deploy: Any, tmp_path: Any, arguments: dict[str, Any], said: str
) -> None:
    """A dict from Python may hold what no JSON text does (a lone surrogate the validator cannot
    take) or nest deeper than it goes: INVALID_INPUT saying so, never a raised ValueError."""
    from blade_runtime.stores.sqlite import SQLiteStore

    ran: list[Any] = []

    async def impl(ctx: Any) -> Any:
        ran.append(ctx)
        return deployed(deploy)

    store = SQLiteStore(tmp_path / "s.db")
    runtime = Runtime(store=store)
    runtime.register(deploy.SPEC, impl)
    try:
        error = error_of(run(runtime.call("deploy_service", arguments)), ErrorCode.INVALID_INPUT)
    finally:
        store.close()
    assert said in error.message and ran == []


def test_invalid_output_is_generic_for_the_model_and_detailed_for_operators(
    deploy: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def impl(ctx: Any) -> Any:
        return deploy.DeployServiceOutput.model_construct(deployed=True, steps=-3)  # minimum 0

    runtime = Runtime()
    runtime.register(deploy.SPEC, impl)
    with caplog.at_level(logging.ERROR, logger="blade_runtime"):
        error = error_of(run(runtime.call("deploy_service", GOOD)), ErrorCode.INVALID_OUTPUT)
    assert error.message == "The tool failed to produce a valid result."
    assert "/steps" not in error.message
    assert "at /steps: -3 is less than the minimum of 0" in caplog.text


def test_fail_reaches_the_model_verbatim_even_through_except_exception(deploy: Any) -> None:
    async def impl(ctx: Any) -> Any:
        try:
            ctx.fail("Version v1.2.3 is not built yet; build it first.")
        except Exception:  # must not swallow a deliberate failure
            return deployed(deploy)

    runtime = Runtime()
    runtime.register(deploy.SPEC, impl)
    error = error_of(run(runtime.call("deploy_service", GOOD)), ErrorCode.TOOL_FAILED)
    assert error.message == "Version v1.2.3 is not built yet; build it first."
    assert issubclass(ToolFailed, BaseException) and not issubclass(ToolFailed, Exception)


def test_exceptions_are_generic_unless_the_app_maps_them(
    deploy: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def impl(ctx: Any) -> Any:
        raise ConnectionError("db-7.internal refused the connection")

    plain = Runtime()
    plain.register(deploy.SPEC, impl)
    with caplog.at_level(logging.ERROR, logger="blade_runtime"):
        error = error_of(run(plain.call("deploy_service", GOOD)), ErrorCode.TOOL_ERROR)
    assert "db-7" not in error.message and "internal error" in error.message
    assert "db-7.internal refused the connection" in caplog.text  # the traceback is logged

    def mapper(exc: BaseException, call: Any) -> str | None:
        return (
            "The deployment service is unreachable." if isinstance(exc, ConnectionError) else None
        )

    mapped = Runtime(error_mapper=mapper)
    mapped.register(deploy.SPEC, impl)
    error = error_of(run(mapped.call("deploy_service", GOOD)), ErrorCode.TOOL_ERROR)
    assert error.message == "The deployment service is unreachable."


def test_an_unknown_name_is_not_found_unless_a_fallback_handles_it(deploy: Any) -> None:
    error = error_of(run(Runtime().call("nope", {})), ErrorCode.TOOL_HANDLER_NOT_FOUND)
    assert "nope" in error.message

    async def fallback(request: Any) -> Any:
        return {"handled": request.name, "args": dict(request.arguments)}

    result = run(Runtime(fallback=fallback).call("nope", {"a": 1}))
    assert isinstance(result, ToolSuccess) and result.content == {
        "handled": "nope",
        "args": {"a": 1},
    }


def test_display_content_and_tool_data(deploy: Any) -> None:
    async def impl(ctx: Any) -> Any:
        await ctx.data.write(
            "progress", deploy.DeployServiceProgressData(step="build", status="done")
        )
        await ctx.data.write(
            "progress", deploy.DeployServiceProgressData(step="push", status="running"), id="p"
        )
        await ctx.data.write(
            "progress", deploy.DeployServiceProgressData(step="push", status="done"), id="p"
        )
        items = await ctx.data.list("progress")
        ctx.display({"markdown": f"{len(items)} steps"})
        return deployed(deploy, steps=len(items))

    runtime = Runtime()
    runtime.register(deploy.SPEC, impl)
    result = run(runtime.call("deploy_service", GOOD))
    assert isinstance(result, ToolSuccess)
    assert result.output.steps == 2  # the same id updated in place
    assert result.display == {"markdown": "2 steps"}


def test_a_data_record_its_channel_rejects_is_a_tool_error(
    deploy: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def impl(ctx: Any) -> Any:
        await ctx.data.write("log", {"level": "debug"})  # no line, unknown level
        return deployed(deploy)

    runtime = Runtime()
    runtime.register(deploy.SPEC, impl)
    with caplog.at_level(logging.ERROR, logger="blade_runtime"):
        error_of(run(runtime.call("deploy_service", GOOD)), ErrorCode.TOOL_ERROR)
    assert "channel 'log' rejected a record" in caplog.text


# -- timeouts and cancellation -----------------------------------------------------------------


def test_a_timeout_cancels_the_implementation_and_awaits_its_cleanup(deploy: Any) -> None:
    cleaned: list[str | None] = []

    async def slow(ctx: Any) -> Any:
        try:
            await asyncio.sleep(10)
        finally:
            cleaned.append(ctx.signal.reason)
        return deployed(deploy)

    runtime = Runtime(timeout_ms=50)
    runtime.register(deploy.SPEC, slow)
    error = error_of(run(runtime.call("deploy_service", GOOD)), ErrorCode.TIMEOUT)
    assert error.message == "The tool did not finish within 0.05 s."
    assert cleaned == ["the call ran past its deadline"]


def test_the_deadline_starts_after_pre_hooks(deploy: Any) -> None:
    async def quick(ctx: Any) -> Any:
        await asyncio.sleep(0.02)
        return deployed(deploy)

    async def slow_hook(event: Any) -> None:
        await asyncio.sleep(0.15)

    runtime = Runtime(timeout_ms=100)
    runtime.register(deploy.SPEC, quick)
    runtime.on("pre_tool_use", slow_hook)
    assert run(runtime.call("deploy_service", GOOD)).status == "success"


def test_an_implementation_ignoring_cancellation_is_abandoned_and_blocks_its_registration(
    deploy: Any, caplog: pytest.LogCaptureFixture
) -> None:
    release = asyncio.Event()
    finished: list[bool] = []

    async def stubborn(ctx: Any) -> Any:
        while True:
            try:
                await release.wait()
                break
            except asyncio.CancelledError:
                continue  # ignores cancellation
        finished.append(True)
        return deployed(deploy)

    async def scenario() -> list[Any]:
        runtime = Runtime(timeout_ms=20, cleanup_grace_s=0.05)
        runtime.register(deploy.SPEC, stubborn)
        loop = asyncio.get_running_loop()
        started = loop.time()
        first = await runtime.call("deploy_service", GOOD)
        waited = loop.time() - started
        refused = await runtime.call("deploy_service", GOOD)
        release.set()
        for _ in range(10):
            await asyncio.sleep(0)
        return [first, waited, refused, await runtime.call("deploy_service", GOOD)]

    with caplog.at_level(logging.WARNING, logger="blade_runtime"):
        first, waited, refused, after = asyncio.run(scenario())
    error_of(first, ErrorCode.TIMEOUT)
    assert waited < 1.0  # the deadline plus the grace period, not forever
    assert "ignored cancellation" in caplog.text
    error_of(refused, ErrorCode.TOOL_UNAVAILABLE)
    assert finished  # the detached implementation ran to its end
    assert "accepts calls again" in caplog.text
    assert after.status == "success"


def test_a_cancelled_call_still_cleaning_up_holds_off_its_runs_new_tool_work(
    deploy: Any,
) -> None:
    """Seed 000: while a cancelled tool's cleanup is pending, the pipeline refuses new tool
    work (of its run, here: other runs go on), until the implementation exits."""
    release = asyncio.Event()

    async def stubborn(ctx: Any) -> Any:
        while True:
            try:
                await release.wait()
                break
            except asyncio.CancelledError:
                continue  # ignores cancellation
        return deployed(deploy)

    async def quick(ctx: Any) -> Any:
        return deployed(deploy)

    async def scenario() -> list[Any]:
        runtime = Runtime(timeout_ms=50, cleanup_grace_s=0.05)
        runtime.register(deploy.SPEC, stubborn)
        runtime.register(deploy.SPEC, quick, name="deploy_quick")
        timed_out = await runtime.call("deploy_service", GOOD, run_id="r1")
        same_run = await runtime.call("deploy_quick", GOOD, run_id="r1")
        other_run = await runtime.call("deploy_quick", GOOD, run_id="r2")
        release.set()
        for _ in range(10):
            await asyncio.sleep(0)
        again = await runtime.call("deploy_quick", GOOD, run_id="r1")
        return [timed_out, same_run, other_run, again]

    timed_out, same_run, other_run, again = asyncio.run(scenario())
    error_of(timed_out, ErrorCode.TIMEOUT)
    refused = error_of(same_run, ErrorCode.TOOL_UNAVAILABLE)
    assert "still cleaning up" in refused.message
    assert other_run.status == "success" and again.status == "success"


def test_cancelling_a_run_cancels_its_calls_only(deploy: Any) -> None:
    async def waits(ctx: Any) -> Any:
        await ctx.signal.wait()
        await asyncio.sleep(10)
        return deployed(deploy)

    async def scenario() -> tuple[list[ToolResult[Any]], int]:
        runtime = Runtime(timeout_ms=2_000)
        runtime.register(deploy.SPEC, waits)
        calls = [
            asyncio.create_task(
                runtime.call("deploy_service", GOOD, call_id=f"c{i}", run_id=run_id)
            )
            for i, run_id in enumerate(["a", "a", "b"])
        ]
        await asyncio.sleep(0.01)
        cancelled = await runtime.cancel_run("a", "the user stopped the run")
        await asyncio.sleep(0.01)
        assert runtime.cancel_call("c2")
        return list(await asyncio.gather(*calls)), cancelled

    results, cancelled = asyncio.run(scenario())
    assert cancelled == 2
    for result in results[:2]:
        error = error_of(result, ErrorCode.CANCELLED)
        assert error.message == (
            "The tool call was cancelled after its implementation started: "
            "the user stopped the run."
        )
    assert error_of(results[2], ErrorCode.CANCELLED).call.run_id == "b"


def test_cancelling_the_callers_own_task_still_propagates(deploy: Any) -> None:
    async def slow(ctx: Any) -> Any:
        await asyncio.sleep(10)
        return deployed(deploy)

    async def scenario() -> None:
        runtime = Runtime()
        runtime.register(deploy.SPEC, slow)
        task = asyncio.create_task(runtime.call("deploy_service", GOOD))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())


def test_hundreds_of_concurrent_calls_get_their_own_results(deploy: Any) -> None:
    async def echo(ctx: Any) -> Any:
        await asyncio.sleep(random.random() / 100)
        return deploy.DeployServiceOutput(
            deployed=True, steps=ctx.input.canary_percent, url=ctx.call.call_id
        )

    async def scenario() -> list[ToolResult[Any]]:
        runtime = Runtime()
        runtime.register(deploy.SPEC, echo)
        return await asyncio.gather(
            *(
                runtime.call(
                    "deploy_service", {**GOOD, "canary_percent": i % 101}, call_id=f"call-{i}"
                )
                for i in range(500)
            )
        )

    results = asyncio.run(scenario())
    for i, result in enumerate(results):
        assert isinstance(result, ToolSuccess)
        assert result.call.call_id == f"call-{i}"
        assert result.content == {"deployed": True, "steps": i % 101, "url": f"call-{i}"}


def test_a_call_id_that_is_already_running_is_a_caller_bug(deploy: Any) -> None:
    async def slow(ctx: Any) -> Any:
        await asyncio.sleep(0.05)
        return deployed(deploy)

    async def scenario() -> None:
        runtime = Runtime()
        runtime.register(deploy.SPEC, slow)
        first = asyncio.create_task(runtime.call("deploy_service", GOOD, call_id="same"))
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match="call id 'same' is already running"):
            await runtime.call("deploy_service", GOOD, call_id="same")
        assert (await first).status == "success"

    asyncio.run(scenario())


# -- hooks and permission ----------------------------------------------------------------------


def hooked(deploy: Any, impl: Impl | None = None, **options: Any) -> tuple[Runtime, list[Any]]:
    executed: list[Any] = []

    async def default(ctx: Any) -> Any:
        executed.append(ctx.input)
        return deployed(deploy)

    runtime = Runtime(**options)
    runtime.register(deploy.SPEC, impl or default)
    return runtime, executed


def test_pre_hooks_all_run_on_the_original_input_and_merge_until_the_first_abort(
    deploy: Any,
) -> None:
    from blade_runtime.core.hooks import HookOutput

    runtime, executed = hooked(deploy)
    seen: list[tuple[str, Any]] = []

    def hook(label: str, output: HookOutput) -> Any:
        async def callback(event: Any) -> HookOutput:
            seen.append((label, dict(event.input)))
            return output

        return callback

    runtime.on("pre_tool_use", hook("a", HookOutput(modified_input={"canary_percent": 5})))
    runtime.on("pre_tool_use", hook("b", HookOutput(modified_input={"environment": "production"})))
    result = run(runtime.call("deploy_service", GOOD))
    assert result.status == "success"
    assert [label for label, _ in seen] == ["a", "b"]
    assert all(event_input == GOOD for _, event_input in seen)  # every hook saw the original
    assert executed[0].canary_percent == 5 and executed[0].environment == "production"

    runtime.on("pre_tool_use", hook("c", HookOutput(action="abort", reason="Deploys are frozen.")))
    runtime.on("pre_tool_use", hook("d", HookOutput(action="skip", reason="later")))
    seen.clear()
    error = error_of(run(runtime.call("deploy_service", GOOD)), ErrorCode.HOOK_ABORTED)
    assert error.message == "Deploys are frozen."
    assert [label for label, _ in seen] == ["a", "b", "c", "d"]  # all ran; the first abort wins
    assert len(executed) == 1


def test_the_scheduled_observer_sees_the_models_own_arguments_beside_the_final_input(
    deploy: Any,
) -> None:
    """Seed 000's ToolScheduledLifecycle: ``modelInput`` (the provider's arguments) beside
    ``input`` (what the hooks made of them)."""
    from blade_runtime.core.hooks import HookOutput

    runtime, executed = hooked(deploy)
    seen: list[tuple[Any, Any]] = []

    class Scheduled:
        async def scheduled(self, event: Any) -> None:
            seen.append((dict(event.model_input), dict(event.input)))

    runtime.observe(Scheduled())
    run(runtime.call("deploy_service", GOOD))  # no hook: the same

    async def canary(event: Any) -> HookOutput:
        return HookOutput(modified_input={"canary_percent": 5})

    runtime.on("pre_tool_use", canary)
    run(runtime.call("deploy_service", GOOD))
    (plain_model, plain_input), (model, final) = seen
    assert plain_model == plain_input == GOOD
    assert model == GOOD and final == {**GOOD, "canary_percent": 5}
    assert executed[-1].canary_percent == 5


def test_a_skip_is_a_success_carrying_the_reason(deploy: Any) -> None:
    from blade_runtime.core.hooks import HookOutput

    runtime, executed = hooked(deploy)

    async def skip(event: Any) -> HookOutput:
        return HookOutput(action="skip", reason="Already deployed in this run.")

    runtime.on("pre_tool_use", skip)
    result = run(runtime.call("deploy_service", GOOD))
    assert isinstance(result, ToolSkipped) and result.status == "success"
    assert result.content == {"skipped": True, "reason": "Already deployed in this run."}
    assert executed == []


def test_a_modified_input_is_validated_before_anything_runs(deploy: Any) -> None:
    from blade_runtime.core.hooks import HookOutput

    runtime, executed = hooked(deploy)

    async def breaks(event: Any) -> HookOutput:
        return HookOutput(modified_input={"environment": "moon"})

    runtime.on("pre_tool_use", breaks)
    error = error_of(run(runtime.call("deploy_service", GOOD)), ErrorCode.INVALID_INPUT)
    assert '(got "moon")' in error.message
    assert executed == []


def test_permission_sees_the_input_that_executes(deploy: Any) -> None:
    from blade_runtime.core.hooks import HookOutput

    asked: list[PermissionRequest] = []

    async def permission(request: PermissionRequest) -> str | None:
        asked.append(request)
        return (
            "Production deploys need a change ticket."
            if request.input["environment"] == "production"
            else None
        )

    runtime, executed = hooked(deploy, permission=permission)

    async def to_production(event: Any) -> HookOutput:
        return HookOutput(modified_input={"environment": "production"})

    runtime.on("pre_tool_use", to_production)
    error = error_of(run(runtime.call("deploy_service", GOOD)), ErrorCode.PERMISSION_DENIED)
    assert error.message == "Production deploys need a change ticket."
    assert asked[0].input["environment"] == "production" and executed == []


def test_hook_failures_and_timeouts(deploy: Any, caplog: pytest.LogCaptureFixture) -> None:
    async def raises(event: Any) -> None:
        raise RuntimeError("audit backend down")

    async def hangs(event: Any) -> None:
        await asyncio.sleep(10)

    runtime, executed = hooked(deploy)
    runtime.on("pre_tool_use", raises)
    with caplog.at_level(logging.ERROR, logger="blade_runtime"):
        error_of(run(runtime.call("deploy_service", GOOD)), ErrorCode.HOOK_FAILED)
    assert "audit backend down" in caplog.text

    runtime, executed = hooked(deploy, hook_timeout_ms=30)
    runtime.on("pre_tool_use", hangs)
    error_of(run(runtime.call("deploy_service", GOOD)), ErrorCode.HOOK_TIMEOUT)
    assert executed == []


def test_post_hooks_rewrite_what_the_model_reads_not_the_output(deploy: Any) -> None:
    from blade_runtime.core.hooks import HookOutput

    runtime, _ = hooked(deploy)
    seen: list[Any] = []

    async def redact(event: Any) -> HookOutput:
        seen.append((event.event, dict(event.input), event.output))
        return HookOutput(modified_output={"deployed": True, "steps": "redacted"})

    runtime.on("post_tool_use", redact)
    result = run(runtime.call("deploy_service", GOOD))
    assert isinstance(result, ToolSuccess)
    assert result.content == {"deployed": True, "steps": "redacted"}
    assert result.output == deployed(deploy)
    assert seen == [("post_tool_use", GOOD, {"deployed": True, "steps": 1})]

    async def withhold(event: Any) -> HookOutput:
        return HookOutput(action="abort", reason="The result contains secrets.")

    runtime.on("post_tool_use", withhold)
    error = error_of(run(runtime.call("deploy_service", GOOD)), ErrorCode.HOOK_ABORTED)
    assert error.message == "The result contains secrets."


def test_failure_hooks_see_the_error_and_never_hide_it(deploy: Any) -> None:
    async def fails(ctx: Any) -> Any:
        ctx.fail("No such version.")

    runtime, _ = hooked(deploy, impl=fails)
    seen: list[Any] = []

    async def observe(event: Any) -> None:
        seen.append(event.error.code)

    async def broken(event: Any) -> None:
        raise RuntimeError("hook bug")

    runtime.on("post_tool_use_failure", observe)
    runtime.on("post_tool_use_failure", broken)
    error = error_of(run(runtime.call("deploy_service", GOOD)), ErrorCode.TOOL_FAILED)
    assert error.message == "No such version."
    assert seen == [ErrorCode.TOOL_FAILED]


def _nested(depth: int) -> list[Any]:
    outer: list[Any] = []
    inner = outer
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return outer


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), datetime.date(2020, 1, 1), {1, 2}, b"raw", _nested(100_000)],
    ids=["nan", "infinity", "date", "set", "bytes", "too-deep"],
)
def test_a_hook_output_that_is_not_json_is_the_hooks_failure(deploy: Any, value: Any) -> None:
    """What no store holds and no client reads back never reaches the model as content, nor
    the call as input: the hook failed (a failure hook's leaves the original error)."""
    from blade_runtime.core.hooks import HookOutput

    runtime, executed = hooked(deploy)

    async def rewrites(event: Any) -> HookOutput:
        return HookOutput(modified_output={"deployed": True, "steps": value})

    runtime.on("post_tool_use", rewrites)
    error_of(run(runtime.call("deploy_service", GOOD)), ErrorCode.HOOK_FAILED)
    assert len(executed) == 1

    async def fails(ctx: Any) -> Any:
        ctx.fail("No such version.")

    failing, _ = hooked(deploy, impl=fails)
    failing.on("post_tool_use_failure", rewrites)
    error = error_of(run(failing.call("deploy_service", GOOD)), ErrorCode.TOOL_FAILED)
    assert error.message == "No such version."

    async def changes_input(event: Any) -> HookOutput:
        return HookOutput(modified_input={"canary_percent": value})

    guarded, ran = hooked(deploy)
    guarded.on("pre_tool_use", changes_input)
    error_of(run(guarded.call("deploy_service", GOOD)), ErrorCode.HOOK_FAILED)
    assert ran == []


def test_a_hook_output_as_a_tuple_is_read_as_an_array(deploy: Any) -> None:
    from blade_runtime.core.hooks import HookOutput

    runtime, _ = hooked(deploy)

    async def rewrites(event: Any) -> HookOutput:
        return HookOutput(modified_output={"steps": ("build", "ship")})

    runtime.on("post_tool_use", rewrites)
    result = run(runtime.call("deploy_service", GOOD))
    assert isinstance(result, ToolSuccess) and result.content == {"steps": ["build", "ship"]}


def test_hooks_can_be_limited_to_some_tools(deploy: Any) -> None:
    from blade_runtime.core.hooks import HookOutput

    runtime, _ = hooked(deploy)

    async def block(event: Any) -> HookOutput:
        return HookOutput(action="abort", reason="blocked")

    runtime.on("pre_tool_use", block, tools=["something_else"])
    assert run(runtime.call("deploy_service", GOOD)).status == "success"


def test_results_serialize_to_json(deploy: Any) -> None:
    runtime, _ = hooked(deploy)
    result = run(runtime.call("deploy_service", GOOD))
    json.dumps(result.content)
    error = run(runtime.call("deploy_service", {}))
    assert json.loads(json.dumps(error.content))["error"] == "INVALID_INPUT"


def test_the_memory_store_keeps_settled_calls_data_for_a_bounded_while(deploy: Any) -> None:
    from blade_runtime.stores.memory import MemoryStore

    async def impl(ctx: Any) -> Any:
        await ctx.data.write(
            "progress", deploy.DeployServiceProgressData(step="build", status="done")
        )
        return deployed(deploy)

    store = MemoryStore(keep_settled=3)
    runtime = Runtime(store=store)
    runtime.register(deploy.SPEC, impl)
    for i in range(5):
        assert isinstance(run(runtime.call("deploy_service", GOOD, call_id=f"c{i}")), ToolSuccess)
    kept = [i for i in range(5) if store.data(f"c{i}", "progress")]
    assert kept == [2, 3, 4]  # the last three settled calls, oldest forgotten first
    assert store.data("c4", "progress")[0].value == {"step": "build", "status": "done"}


def test_a_call_that_writes_tooldata_is_recorded_and_its_principal_sees_it(deploy: Any) -> None:
    """Issue 38: the memory store records a call by the rule every store follows (one that
    writes ToolData is recorded), so its principal reads the call, its data and its events, and
    another principal of the tenant reads none of them."""
    from blade_runtime import CallContext, Principal

    async def impl(ctx: Any) -> Any:
        await ctx.data.write(
            "progress", deploy.DeployServiceProgressData(step="build", status="done")
        )
        return deployed(deploy)

    alice, bob = Principal("alice", "acme"), Principal("bob", "acme")
    runtime = Runtime()
    runtime.register(deploy.SPEC, impl)

    async def scenario() -> tuple[Any, ...]:
        done = await runtime.call(
            "deploy_service", GOOD, call_id="c-data", run_id="r-data", context=CallContext(alice)
        )
        assert isinstance(done, ToolSuccess)
        records = runtime.records
        return (
            await records.call("c-data", principal=alice),
            await records.data("c-data", principal=alice),
            await records.events("r-data", principal=alice),
            await records.call("c-data", principal=bob),
            await records.data("c-data", principal=bob),
            await records.events("r-data", principal=bob),
        )

    call, data, events, bobs_call, bobs_data, bobs_events = run(scenario())
    assert call is not None and call.state == "settled" and call.principal == "alice"
    assert [d.value for d in data] == [{"step": "build", "status": "done"}]
    assert [e.kind for e in events] == ["started", "data", "result"]
    assert (bobs_call, bobs_data, bobs_events) == (None, [], [])


def test_arguments_as_json_text_are_parsed_strictly(deploy: Any) -> None:
    async def impl(ctx: Any) -> Any:
        return deployed(deploy)

    runtime = Runtime()
    runtime.register(deploy.SPEC, impl)
    assert isinstance(run(runtime.call("deploy_service", json.dumps(GOOD))), ToolSuccess)
    assert isinstance(run(runtime.call("deploy_service", json.dumps(GOOD).encode())), ToolSuccess)
    for text in ('{"service": NaN}', "{not json", "[1, 2]", '"text"'):
        refused = error_of(run(runtime.call("deploy_service", text)), ErrorCode.INVALID_INPUT)
        assert "JSON" in refused.message


@pytest.mark.parametrize("field", ["call_id", "run_id"])
@pytest.mark.parametrize(
    "value", ["a\x00b", "a\ud800b", "x" * 201, "", "two\nlines"], ids=lambda v: repr(v)[:12]
)
def test_an_id_no_store_could_hold_is_invalid_input_on_every_store(
    deploy: Any, tmp_path: Any, field: str, value: str
) -> None:
    """Ids are 1 to 200 printable characters: what PostgreSQL's text and index, UTF-8 and a
    SQLite file all hold alike (a NUL, a lone surrogate or a 3,000-character id failed on one
    store and not another, as a raw driver error or a STORE_UNAVAILABLE to retry forever)."""
    from blade_runtime.stores.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "ids.db")
    runtime = Runtime(store=store)

    async def impl(ctx: Any) -> Any:
        return deployed(deploy)

    runtime.register(deploy.SPEC, impl)
    try:
        ids = {"call_id": "c-1", "run_id": "r-1", field: value}
        error = error_of(run(runtime.call("deploy_service", GOOD, **ids)), ErrorCode.INVALID_INPUT)
        assert "1 to 200 printable characters" in error.message
        assert store.calls() == []
        unknown = run(runtime.submit("act_\udc80", {"approved": True}))
        error_of(unknown, ErrorCode.UNKNOWN_ACTION)
    finally:
        store.close()


def test_progress_and_messages_reach_subscribers_in_order_and_never_fail_the_tool(
    example_package: Any,
) -> None:
    from blade_specs.deploy import deploy_service_v1 as deploy

    async def deploys(ctx: Any) -> Any:
        for step in range(1, 4):
            ctx.progress(f"step {step}", completed=step, total=3)
        ctx.message({"note": "canary healthy"})
        ctx.message(object())  # not JSON: shown as its text, never an error
        ctx.progress("odd amounts", completed=Decimal("0.5"), total=float("nan"))
        return deploy.DeployServiceOutput(deployed=True, steps=3)

    async def scenario() -> tuple[Any, list[Any], Any]:
        runtime = Runtime()
        runtime.register(deploy.SPEC, deploys)
        alone = await runtime.call("deploy_service", GOOD, run_id="nobody-watches")
        watching = runtime.subscribe("r1")
        closed = runtime.subscribe("r1")
        closed.close()  # a watcher that went away is not the tool's problem
        result = await runtime.call("deploy_service", GOOD, run_id="r1")
        watching.close()
        return alone, [event async for event in watching], result

    alone, events, result = asyncio.run(scenario())
    assert isinstance(alone, ToolSuccess) and isinstance(result, ToolSuccess)
    kinds = [e.kind for e in events]
    assert kinds == [
        "started",
        "progress",
        "progress",
        "progress",
        "message",
        "message",
        "progress",
        "result",
    ]
    # amounts JSON cannot carry (a NaN, any number type) are JSON numbers or null
    assert events[6].payload == {"message": "odd amounts", "completed": 0.5, "total": None}
    json.dumps(events[6].payload, allow_nan=False)
    assert [e.payload for e in events[1:4]] == [
        {"message": f"step {n}", "completed": n, "total": 3} for n in (1, 2, 3)
    ]
    assert events[4].payload == {"note": "canary healthy"}
    assert isinstance(events[5].payload, str) and events[5].payload.startswith("<object")
