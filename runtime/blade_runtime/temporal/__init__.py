"""Run blade tools on Temporal (``pip install 'blade-runtime[temporal]'``).

A worker runs a ``Runtime`` built on an ``ActivityStore``; each tool call is a ``CallWorkflow``
whose steps are activities running the runtime's pipeline, and whose pending actions are held
by the workflow and answered with updates::

    runtime = Runtime(store=ActivityStore())
    runtime.register(SPEC, implementation)
    async with worker(client, runtime, task_queue="blade"):
        tools = TemporalTools(client, task_queue="blade", runtime=runtime)
        result = await tools.call("lookup", {"id": 7})

See docs/temporal.md.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from blade_runtime.runtime import Runtime
from blade_runtime.temporal.activities import ToolActivities
from blade_runtime.temporal.client import TemporalTools, workflow_id
from blade_runtime.temporal.store import ActivityStore
from blade_runtime.temporal.transport import TemporalTransport
from blade_runtime.temporal.workflow import SEARCH_ATTRIBUTES, CallWorkflow

__all__ = [
    "SEARCH_ATTRIBUTES",
    "STICKY_TIMEOUT_S",
    "ActivityStore",
    "CallWorkflow",
    "TemporalTools",
    "TemporalTransport",
    "ToolActivities",
    "sandbox",
    "worker",
    "workflow_id",
]


def sandbox() -> SandboxedWorkflowRunner:
    """Temporal's workflow sandbox with ``blade_runtime`` (and pydantic, jsonschema-rs) passed
    through: the workflow only reads them deterministically, and the sandbox would otherwise
    import the runtime again for every workflow it runs (some 0.3 s each). OpenTelemetry too,
    as Temporal's tracing interceptor needs (``temporalio.contrib.opentelemetry``)."""
    restrictions = SandboxRestrictions.default.with_passthrough_modules(
        "blade_runtime", "pydantic", "pydantic_core", "jsonschema_rs", "opentelemetry"
    )
    return SandboxedWorkflowRunner(restrictions=restrictions)


STICKY_TIMEOUT_S = 10.0
"""Temporal's default: how long a call's next workflow step waits for the worker that ran its
last one (which caches the workflow) before any other worker takes it."""


def worker(
    client: Client,
    runtime: Runtime,
    *,
    task_queue: str = "blade",
    sticky_timeout_s: float = STICKY_TIMEOUT_S,
    **options: Any,
) -> Worker:
    """A Temporal worker running ``runtime``'s tools as activities and the call workflows
    (``options`` go to ``temporalio.worker.Worker``). Use it as ``async with`` or ``run()``.

    ``sticky_timeout_s``: how long a workflow step waits for this worker, once it ran the
    call's last one, before another worker takes it. When a worker dies in a call, the call
    settles (INTERRUPTED for a non_idempotent step, run again otherwise) within about the
    call's ``heartbeat_s`` (``TemporalTools``) plus this, plus the server's own dispatch: a
    lower value moves a dead worker's calls sooner, at the cost of more workflow replays on
    the others when a live worker is merely slow."""
    if sticky_timeout_s <= 0:
        raise ValueError(f"sticky_timeout_s is a number of seconds above 0, not {sticky_timeout_s}")
    options.setdefault("workflow_runner", sandbox())
    options.setdefault(
        "sticky_queue_schedule_to_start_timeout", timedelta(seconds=sticky_timeout_s)
    )
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[CallWorkflow],
        activities=ToolActivities(runtime).activities(),
        **options,
    )
