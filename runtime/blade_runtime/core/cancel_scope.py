"""Run an implementation in the caller's task, under a deadline, with bounded cleanup.

A task per call would cost more than validating the call's input and output (two event-loop
iterations), so the implementation's coroutine is driven in the caller's own task, the way
``await`` would drive it. The driver differs from a plain ``await`` in two ways:

- the deadline timer is armed at the first real suspension: an implementation that finishes without
  suspending cannot be preempted anyway, and pays nothing for the timer;
- when the implementation ignores cancellation for longer than the grace period, the driver stops
  forwarding to it and hands the suspended coroutine to a background task of its own, so the caller
  gets its result after at most the grace period while the implementation keeps running (Python
  cannot preempt it) and is reported.

Cancellation is ``Task.cancel`` on the caller's task, counted and taken back with ``uncancel`` like
``asyncio.timeout`` does, so a cancellation that comes from outside still propagates.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Coroutine, Generator
from time import monotonic as _monotonic
from typing import Any, Literal, Protocol, TypeVar

from blade_runtime.core.context import CallInfo, CancellationSignal

T = TypeVar("T")

GRACE_S = 5.0
"""How long an implementation's cleanup is awaited after it was cancelled."""

CancelReason = Literal["timeout", "cancelled", "lease_lost"]


class Owner(Protocol):
    """What runs the call: it is told about an implementation left running detached."""

    def track(self, task: asyncio.Task[None]) -> None: ...


class Abandoned(BaseException):
    """The implementation ignored cancellation past the grace period; it now runs detached.

    A BaseException, like CancelledError: it is control flow, not an error of the tool."""


class CancelScope:
    """Cancellation of one call: by deadline, or on request (the call or its run was cancelled)."""

    # Class-level defaults instead of slots: a call that never suspends touches none of them,
    # and the scope is built on the path of every call.
    task: asyncio.Task[Any] | None = None
    reason: CancelReason | None = None
    active = True
    running = False
    entered = False
    """Whether the implementation was entered (a cancelled call's record says so)."""
    grace_s = GRACE_S
    _deadline: float | None = None
    _timer: asyncio.TimerHandle | None = None
    _grace_timer: asyncio.TimerHandle | None = None
    _requested = 0
    _abandoning = False
    _signal: CancellationSignal | None = None
    stored: Any = None
    """What the runtime recorded for this call, so that a cancelled call is settled there too."""
    observed = False
    """Whether lifecycle observers saw the call scheduled (so they see it settle)."""
    detached: asyncio.Task[Any] | None = None
    """The task its implementation runs on after it ignored cancellation past the grace."""
    model_input: Any = None
    """The model's own arguments, when a pre_tool_use hook changed them (the scheduled
    observers see both)."""

    def __init__(
        self,
        call: CallInfo,
        running: dict[str, CancelScope],
        owner: Owner | None,
    ) -> None:
        self.call = call
        self._running = running
        self._owner = owner

    @property
    def owner(self) -> Owner | None:
        """The registration whose implementation runs under this scope."""
        return self._owner

    @property
    def signal(self) -> CancellationSignal:
        """The call's cancellation signal, made when first asked for (most calls never are)."""
        if self._signal is None:
            self._signal = CancellationSignal()
        return self._signal

    def bind(self) -> None:
        """Remember the caller's task and enter ``running`` by call id, where cancellation
        requests find the scope. Must run before the call first suspends: only then can code in
        another task or a timer ask to cancel it. (Lazily, because most calls never suspend, and
        ``current_task`` plus the bookkeeping cost as much as validating a small input.)"""
        if self.task is None:
            self.task = _current_task()
            self._running[self.call.call_id] = self

    def close(self) -> None:
        """The call settled: stop the timers, take back cancellations, leave ``running``."""
        self.stop()
        if self.reason is not None:
            self.release()
        if self.task is not None:
            del self._running[self.call.call_id]

    def cancel(self, reason: CancelReason, message: str) -> bool:
        """Cancel the call unless it already settled or was cancelled; True if this did it."""
        if not self.active or self.reason is not None:
            return False
        self.reason = reason
        self.signal.cancel(message)
        self._cancel_task()
        if self.running:
            self._grace_timer = asyncio.get_running_loop().call_later(self.grace_s, self._give_up)
        return True

    def run(self, awaitable: Awaitable[T], timeout_s: float) -> Awaitable[T]:
        """Awaitable that drives ``awaitable`` with a deadline ``timeout_s`` from now."""
        # The monotonic clock, not the loop's: one C call on every call's path; the timer
        # (armed only when the call first suspends) converts it to a delay on the loop.
        self._deadline = _monotonic() + timeout_s
        self.running = self.entered = True
        if type(awaitable) is not _COROUTINE:
            awaitable = _coroutine(awaitable)
        return _drive(awaitable, self)

    def arm(self, timeout_s: float) -> None:
        """What ``run`` does before the caller takes the coroutine's first step itself (most
        calls finish in it, and need no driver); ``resume`` drives it on from there."""
        self._deadline = _monotonic() + timeout_s
        self.running = self.entered = True

    def resume(self, coroutine: Coroutine[Any, Any, T], yielded: Any) -> Awaitable[T]:
        """Awaitable that drives ``coroutine`` on from its first suspension, which yielded
        ``yielded`` (``arm`` set the deadline)."""
        return _drive(coroutine, self, None, yielded)

    def stop(self) -> None:
        """The implementation returned or raised: no timer may fire into what follows."""
        if not self.active:
            return
        self.running = False
        self.active = False
        if self._timer is not None:
            self._timer.cancel()
        if self._grace_timer is not None:
            self._grace_timer.cancel()

    def release(self) -> int:
        """Take back the cancellations this scope requested; the caller's remaining count.

        Must run before the call returns: a cancellation requested but never taken back would
        hit the caller's next ``await``."""
        self.stop()
        self.bind()
        assert self.task is not None
        for _ in range(self._requested):
            self.task.uncancel()
        self._requested = 0
        return self.task.cancelling()

    def _suspended(self) -> None:
        self.bind()
        if self._timer is None and self._deadline is not None:
            delay = max(0.0, self._deadline - _monotonic())
            self._timer = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        self.cancel("timeout", "the call ran past its deadline")

    def _give_up(self) -> None:
        if self.running:
            self._abandoning = True
            self._cancel_task()

    def _cancel_task(self) -> None:
        # Unbound means the call never suspended, so the code asking runs in the call's own task.
        self.bind()
        assert self.task is not None
        self._requested += 1
        self.task.cancel()

    def _abandon(self, coroutine: Coroutine[Any, Any, Any], error: BaseException) -> None:
        self.running = False
        detached = asyncio.get_running_loop().create_task(
            _finish_detached(coroutine, error), name=self.call.call_id
        )
        self.detached = detached
        if self._owner is not None:
            self._owner.track(detached)


_NOT_STARTED: Any = object()


@types.coroutine
def _drive(
    coroutine: Coroutine[Any, Any, T],
    scope: CancelScope | None,
    first_error: BaseException | None = None,
    first_yield: Any = _NOT_STARTED,
) -> Generator[Any, Any, T]:
    """``await coroutine``, plus the deadline arming and abandonment described above.

    Without a scope it is a plain ``await`` that starts by throwing ``first_error``: the detached
    task uses it to carry on from where the caller's task let go. ``first_yield``: what the
    coroutine yielded in the first step the caller took itself. (A generator-based coroutine,
    not an object with ``__await__``: it is on the path of every call and costs half as much.)
    """
    sent: Any = None
    thrown = first_error
    while True:
        if first_yield is _NOT_STARTED:
            try:
                yielded = coroutine.send(sent) if thrown is None else coroutine.throw(thrown)
            except StopIteration as finished:
                result: T = finished.value
                return result
        else:
            yielded, first_yield = first_yield, _NOT_STARTED
        if scope is not None:
            scope._suspended()
        sent, thrown = None, None
        try:
            sent = yield yielded
        except GeneratorExit:
            coroutine.close()
            raise
        except BaseException as error:
            if scope is not None and scope._abandoning:
                scope._abandon(coroutine, error)
                raise Abandoned from None
            thrown = error


async def _coroutine(awaitable: Awaitable[T]) -> T:
    """Any awaitable (a Future, an object with ``__await__``) as a coroutine the driver can step."""
    return await awaitable


_COROUTINE = COROUTINE = types.CoroutineType


def _current_task() -> asyncio.Task[Any]:
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("a tool call must run inside an asyncio task")
    return task


async def _finish_detached(coroutine: Coroutine[Any, Any, Any], error: BaseException) -> None:
    await _drive(coroutine, None, error)
