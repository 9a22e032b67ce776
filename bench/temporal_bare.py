"""The bare side of bench/temporal.py: a workflow and activities with no blade runtime, in a module
of its own so that Temporal's workflow sandbox imports nothing else (bench/temporal.py's other
imports touch the file system at import time, which the sandbox refuses)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

TIMEOUT = timedelta(milliseconds=600_000 + 30_000)  # as CallWorkflow schedules a default spec's
HEARTBEAT = timedelta(seconds=10)


def work(n: int, entry: str, note: str = "ok") -> dict[str, Any]:
    """The function both sides run."""
    return {"n": n, "entry": entry, "note": note}


@activity.defn(name="bare.work")
async def bare_work(n: int) -> dict[str, Any]:
    return work(n, "initial")


@activity.defn(name="bare.resume")
async def bare_resume(n: int, note: str) -> dict[str, Any]:
    return work(n, "resume", note)


def _options() -> dict[str, Any]:
    return {
        "start_to_close_timeout": TIMEOUT,
        "heartbeat_timeout": HEARTBEAT,
        "retry_policy": RetryPolicy(maximum_attempts=0),
    }


@workflow.defn(name="BareCall")
class BareCall:
    @workflow.run
    async def run(self, n: int) -> dict[str, Any]:
        done: dict[str, Any] = await workflow.execute_activity(bare_work, n, **_options())
        return done


@workflow.defn(name="BareCycle")
class BareCycle:
    def __init__(self) -> None:
        self.first: dict[str, Any] | None = None
        self.note: str | None = None
        self.done: dict[str, Any] | None = None

    @workflow.run
    async def run(self, n: int) -> dict[str, Any]:
        self.first = await workflow.execute_activity(bare_work, n, **_options())
        await workflow.wait_condition(lambda: self.note is not None)
        assert self.note is not None
        self.done = await workflow.execute_activity(bare_resume, args=[n, self.note], **_options())
        return self.done

    @workflow.update
    async def step(self) -> dict[str, Any]:
        await workflow.wait_condition(lambda: self.first is not None)
        assert self.first is not None
        return self.first

    @workflow.update
    async def submit(self, note: str) -> dict[str, Any]:
        self.note = note
        await workflow.wait_condition(lambda: self.done is not None)
        assert self.done is not None
        return self.done

    @workflow.update
    async def ping(self) -> int:
        return 1
