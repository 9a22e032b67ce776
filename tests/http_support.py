"""What the HTTP tests share: a runtime of the example tools, tokens of three principals (two
tenants and an operator), and a real uvicorn server on 127.0.0.1 in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from starlette.requests import Request

from blade_runtime import ResumeEntry
from blade_runtime.core.caller import Principal
from blade_runtime.core.store import Store
from blade_runtime.runtime import Runtime

TOKENS = {
    "token-alice": Principal("alice", "acme"),
    "token-bob": Principal("bob", "globex"),
    "token-carol": Principal("carol", "acme"),  # alice's tenant, not alice
    "token-root": Principal("root", "ops", frozenset({"operator"})),
}
ALICE = {"Authorization": "Bearer token-alice"}
BOB = {"Authorization": "Bearer token-bob"}
CAROL = {"Authorization": "Bearer token-carol"}
ROOT = {"Authorization": "Bearer token-root"}
REFUND = {
    "payment_id": "pay_1",
    "amount": {"amount_minor": 1250, "currency": "EUR"},
    "reason": "damaged",
}


def authenticate(request: Request) -> Principal | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return TOKENS.get(token) if scheme.lower() == "bearer" else None


class Tools:
    """The example tools with counting implementations: lookup (pure, optionally slow), refund
    (suspends for an approval), check_page (client-executed)."""

    def __init__(self) -> None:
        self.lookups = 0
        self.refund_entries = 0
        self.delay_s = 0.0

    def register(self, runtime: Runtime) -> None:
        from blade_specs.browser import check_page_v1
        from blade_specs.crm import lookup_customer_v1 as lookup
        from blade_specs.payments import refund_payment_v1 as refund

        async def lookup_impl(ctx: Any) -> Any:
            self.lookups += 1
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            return lookup.LookupCustomerOutput(found=False)

        async def refund_impl(ctx: Any) -> Any:
            self.refund_entries += 1
            entry = ctx.entry
            if isinstance(entry, ResumeEntry):
                if not entry.payload.approved:
                    return refund.RefundPaymentOutputDeclined(
                        status="declined", by=entry.payload.approver
                    )
                return refund.RefundPaymentOutputRefunded(status="refunded", refund_id="re_1")
            ctx.suspend(
                "approval",
                refund.RefundPaymentApprovalSuspend(
                    prompt=f"Refund {ctx.input.amount.amount_minor}?", amount=ctx.input.amount
                ),
            )

        runtime.register(
            lookup.SPEC,
            lookup_impl,
            context=lambda call: lookup.LookupCustomerContext(tenant_id="t"),
        )
        runtime.register(
            refund.SPEC,
            refund_impl,
            context=lambda call: refund.RefundPaymentContext(operator_id="op"),
        )
        runtime.register_client(check_page_v1.SPEC)


def process_env(built: Path, **extra: str) -> dict[str, str]:
    """The environment of a server or worker process: the built example package, the tests'
    helpers, and this checkout's runtime and codegen (never another checkout's install)."""
    import blade_runtime

    roots = [str(built), str(Path(__file__).parent), str(Path(blade_runtime.__file__).parents[1])]
    inherited = os.environ.get("PYTHONPATH")
    if inherited:
        roots.append(inherited)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(roots), **extra}


def runtime_of(store: Store | None = None) -> tuple[Runtime, Tools]:
    runtime = Runtime(store=store)
    tools = Tools()
    tools.register(runtime)
    return runtime, tools


def snapshot(store: Store) -> str:
    """Everything the store holds that a request could change."""
    calls = [dataclasses.asdict(c) for c in store.calls()]
    for call in calls:
        call.pop("lease_until")  # the heartbeat renews leases of running calls
    actions = [dataclasses.asdict(a) for a in store.actions(state=None)]
    return json.dumps([calls, actions, store.head() if store.durable else 0], sort_keys=True)


class Server:
    """uvicorn serving ``app`` on 127.0.0.1 (a free port) in a thread of its own."""

    def __init__(self, app: Any, lifespan: str = "off") -> None:
        import uvicorn

        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", lifespan=lifespan, loop="asyncio"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = ""

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        assert not self.thread.is_alive(), "uvicorn did not stop"

    def run(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the server's own event loop (where the runtime lives)."""
        loop = self.loop()
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(30)

    def loop(self) -> asyncio.AbstractEventLoop:
        for _ in range(100):
            servers = self.server.servers
            if servers:
                return servers[0].get_loop()
            time.sleep(0.01)
        raise RuntimeError("no server loop")


@contextlib.contextmanager
def serving(app: Any, lifespan: str = "off") -> Iterator[Server]:
    with Server(app, lifespan) as server:
        yield server
