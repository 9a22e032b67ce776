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

from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, nullcontext
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Generic, TypeAlias, TypeVar

from pydantic import JsonValue

from blade_runtime.core.context import CallInfo, CancellationSignal

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CapabilityUse:
    """One call's use of one capability."""

    name: str
    call: CallInfo
    config: JsonValue
    signal: CancellationSignal


Binding: TypeAlias = Callable[[CapabilityUse], AbstractAsyncContextManager[Any]]


class Shared(Generic[T]):
    """A binding that gives every call the same ``value`` (a client, a pool): nothing is
    acquired or released, so a tool whose bindings are all shared pays nothing per call."""

    def __init__(self, value: T) -> None:
        self.value = value

    def __call__(self, use: CapabilityUse) -> AbstractAsyncContextManager[T]:
        return nullcontext(self.value)


def shared(value: T) -> Shared[T]:
    return Shared(value)


def services_of(bindings: Mapping[str, tuple[Binding, JsonValue]]) -> SimpleNamespace | None:
    """``ctx.capabilities`` made once, when every binding is shared; else None (per call)."""
    if not all(isinstance(binding, Shared) for binding, _ in bindings.values()):
        return None
    return SimpleNamespace(**{name: b.value for name, (b, _) in bindings.items()})  # type: ignore[attr-defined]


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
