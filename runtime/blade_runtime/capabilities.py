"""Declared capabilities: the services a tool needs, bound once per runtime.

A spec declares the services its implementation needs (``"capabilities": {"sandbox":
{"configSchema": ...}}``); a runtime is created with a binding of each
(``Runtime(capabilities={"sandbox": factory})``), and refuses to register a tool whose capability
is unbound, naming the missing ones. A binding is a function of the call's ``CapabilityUse`` (the
name, the call, the registration's configuration, validated against the declared schema, and the
call's cancellation signal) returning an async context manager: it is entered before the
implementation runs (under the call's deadline and cancellation) and exited after, however the
call ends. ``shared(value)`` binds one object for every call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, TypeAlias, TypeVar

from pydantic import JsonValue

from blade_runtime.context import CallInfo, CancellationSignal

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CapabilityUse:
    """One call's use of one capability."""

    name: str
    call: CallInfo
    config: JsonValue
    signal: CancellationSignal


Binding: TypeAlias = Callable[[CapabilityUse], AbstractAsyncContextManager[Any]]


def shared(value: T) -> Callable[[CapabilityUse], AbstractAsyncContextManager[T]]:
    """A binding that gives every call the same ``value`` (a client, a pool): nothing to acquire."""

    @asynccontextmanager
    async def binding(use: CapabilityUse) -> AsyncIterator[T]:
        yield value

    return binding


async def with_capabilities(
    bindings: Mapping[str, tuple[Binding, JsonValue]],
    call: CallInfo,
    signal: CancellationSignal,
    ctx: Any,
    implementation: Callable[[Any], Awaitable[T]],
) -> T:
    """Acquire every binding, run the implementation with ``ctx.capabilities``, and release them
    in reverse order however it ends (an exit stack: one failing release never skips another)."""
    async with AsyncExitStack() as stack:
        services = {
            name: await stack.enter_async_context(
                binding(CapabilityUse(name, call, config, signal))
            )
            for name, (binding, config) in bindings.items()
        }
        ctx.capabilities = SimpleNamespace(**services)
        return await implementation(ctx)
