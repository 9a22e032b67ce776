"""``blade-runtime pending ... --temporal ADDRESS``: the operators' commands against Temporal.

The same verbs as on a store, answered by the call workflows (``blade_runtime.temporal``): a
listing and a show are queries, a submit or cancel is an update, so the workflow validates the
submission against the action's schema before anything is recorded and, on a valid one, a
worker resumes the call at once. The operator acts as the application (every tenant).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from typing import Any

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


def exit_now(code: int) -> None:
    """End the process with ``code`` once the output is flushed, skipping the interpreter's
    finalization: the Temporal client's native threads can outlive it and abort the process
    ("Fatal Python error: PyGILState_Release", exit 134 or 139) after the command has done its
    work (temporalio/sdk-python#300; its known workaround)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(code)


def run_pending(args: Any) -> int:
    try:
        from temporalio.client import Client
    except ImportError as missing:
        print(f"error: {missing}: pip install 'blade-runtime[temporal]'", file=sys.stderr)
        return 2
    return asyncio.run(_run(Client, args))


async def _run(client_type: Any, args: Any) -> int:
    from temporalio.service import RPCError

    from blade_runtime.temporal.client import TemporalTools

    try:
        client = await client_type.connect(args.temporal, namespace=args.namespace)
    except (RuntimeError, RPCError, OSError) as error:
        print(f"error: Temporal at {args.temporal}: {error}", file=sys.stderr)
        return EXIT_UNREACHABLE
    tools = TemporalTools(client)
    try:
        if args.verb == "list":
            return await _list(tools, args)
        if args.verb == "show":
            return await _show(tools, args.action_id)
        if args.verb == "submit":
            text = sys.stdin.read() if args.payload == "-" else args.payload
            try:
                value = json.loads(text)
            except ValueError as error:
                print(f"error: the payload is not JSON: {error}", file=sys.stderr)
                return EXIT_REFUSED
            return _settled(args.action_id, await tools.submit(args.action_id, value))
        return _settled(args.action_id, await tools.cancel(args.action_id, args.reason))
    except RPCError as error:
        print(f"error: Temporal at {args.temporal}: {error}", file=sys.stderr)
        return EXIT_UNREACHABLE


def _view(action: dict[str, Any]) -> dict[str, Any]:
    """As ``pending show --store`` shows an action."""
    name = action["name"] if action["point"] is None else f"{action['name']}.{action['point']}"
    origin = ("name", "spec_id", "call_id", "run_id", "point", "suspended_at")
    return {
        "action_id": action["action_id"],
        "name": name,
        "state": action["state"],
        "origin": {key: action[key] for key in origin},
        "payload": action["payload"],
        "submit_schema": action["submit_schema"],
        "tenant": action["tenant"],
        "expires_at": action["expires_at"],
    }


async def _list(tools: Any, args: Any) -> int:
    """One page of the waiting calls, from Temporal's visibility store (no worker is asked)."""
    from blade_runtime.core.store import BadCursor
    from blade_runtime.serving.cli import listing

    def line(action: dict[str, Any]) -> str:
        return (
            f"{action['action_id']}  {_view(action)['name']}  run={action['run_id']}  "
            f"call={action['call_id']}  since {action['suspended_at']}"
        )

    if args.agent is not None or args.thread is not None:
        print(
            "error: --agent and --thread filter a store's actions; Temporal's visibility "
            "store keeps no origin to filter on: leave them out",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        page = await tools.pending_page(
            run_id=args.run, tool=args.tool, tenant=args.tenant, limit=args.limit, cursor=args.after
        )
    except BadCursor as error:
        print(f"error: --after: {error}", file=sys.stderr)
        return EXIT_USAGE
    return listing(
        page.items,
        args.json,
        _view,
        line,
        "no pending actions",
        first=args.after is None,
        more=page.next,
    )


async def _show(tools: Any, action_id: str) -> int:
    action = await tools.action(action_id)
    if action is None:
        print(f"error: no pending action {action_id!r}", file=sys.stderr)
        return EXIT_REFUSED
    print(json.dumps(_view(action), indent=2, ensure_ascii=False))
    return 0


def _settled(action_id: str, result: dict[str, Any]) -> int:
    if result.get("status") == "error" and result.get("code") in _REFUSALS:
        print(f"error: {result['message']}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"{action_id}: resolved; the call's next step: {json.dumps(result, ensure_ascii=False)}")
    return 0


_REFUSALS = frozenset({"INVALID_SUBMISSION", "UNKNOWN_ACTION", "ACTION_ALREADY_RESOLVED"})
