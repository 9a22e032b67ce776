"""``blade-runtime``: operators' access to pending actions and standing grants in a store.

    blade-runtime pending list --store URL [--run RUN] [--tool NAME] [--json]
    blade-runtime pending show ACTION_ID --store URL
    blade-runtime pending submit ACTION_ID [JSON | -] --store URL
    blade-runtime pending cancel ACTION_ID --store URL [--reason TEXT]
    blade-runtime pending list|show|submit|cancel ... --temporal HOST:PORT [--namespace NS]
    blade-runtime grants list --store URL [--tenant T] [--principal ID] [--tool NAME] [--json]
    blade-runtime grants revoke GRANT_ID --store URL
    blade-runtime serve MODULE:RUNTIME --store URL [--host 127.0.0.1] [--port 8000]
                        [--auth MODULE:FUNCTION | --allow-anonymous]
                        [--allowed-host HOST ...] [--allowed-origin ORIGIN ...]
    blade-runtime mcp MODULE:RUNTIME [--store URL] [--http HOST:PORT] [--inbox-url URL]
                      [--principal ID@TENANT]

URL is what ``blade_runtime.open_store`` takes: sqlite:///path.db, a plain file path, or
postgresql://user:password@host/db (``blade-runtime[postgres]``). The pending commands open
only a store a runtime has made (they never create one, nor add tables to another database);
serve and mcp, being runtimes, create it on their first start.

``mcp`` serves a runtime's tools over MCP (``blade-runtime[mcp]``): on stdio, or on streamable
HTTP at a loopback address; RUNTIME is a Runtime, or a function returning one (called with
``store=`` when --store is given).

A submission is validated exactly as the runtime validates it, against the schema recorded with
the action, before anything is written. Submitting a client tool's output settles its call; a
suspension's resume payload leaves the call resumable: a worker's recovery loop (or the next
``Runtime.recover()`` over the store) claims it and re-enters the implementation. Answering a
permission request with ``{"decision": "approve", "always": true}`` also makes a standing grant
(its principal, tool and subject are not asked again), which ``grants list`` shows and
``grants revoke`` removes.

With ``--temporal`` (``blade-runtime[temporal]``) the pending actions are those the call
workflows of ``blade_runtime.temporal`` hold: a submission is an update the workflow validates
before anything is recorded, and a worker resumes the call at once.

Exit codes: 0 done; 1 refused (invalid submission, unknown or already resolved action, unknown
grant); 2 usage (a list's filter that is not UTF-8 text, too); 3 the store cannot be opened (or
the Temporal server reached); 4 serve or mcp --http cannot listen on the address (the port is
in use, say).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, TypeVar

from blade_runtime import __version__
from blade_runtime.core import actions, grants
from blade_runtime.core.jsonvalue import NotJson, checked
from blade_runtime.core.store import (
    ActionAlreadyResolved,
    ActionRecord,
    GrantRecord,
    Store,
    StoreError,
    UnknownAction,
    clock,
    encodable,
)
from blade_runtime.stores.urls import masked, open_store, sqlite_path

T = TypeVar("T")

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_STORE = 3


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="blade-runtime", description=_plain(__doc__))
    parser.add_argument("--version", action="version", version=f"blade-runtime {__version__}")
    commands = parser.add_subparsers(dest="group", required=True)
    pending = commands.add_parser(
        "pending",
        help="list, show, submit or cancel pending actions",
        description="List, show, submit or cancel the pending actions in a store.",
    )
    verbs = pending.add_subparsers(dest="verb", required=True)
    listing = verbs.add_parser("list", help="pending actions, oldest first")
    listing.add_argument("--run", help="only this run id")
    listing.add_argument("--tool", help="registration name")
    listing.add_argument("--json", action="store_true", help="one JSON document")
    show = verbs.add_parser("show", help="one action, as JSON")
    show.add_argument("action_id")
    submit = verbs.add_parser("submit", help="resolve an action with a JSON payload")
    submit.add_argument("action_id")
    submit.add_argument("payload", nargs="?", default="-", help="JSON text, or - for stdin")
    cancel = verbs.add_parser("cancel", help="settle the action's call as cancelled")
    cancel.add_argument("action_id")
    cancel.add_argument(
        "--reason", default="cancelled by an operator", help="recorded with the action"
    )
    grants = commands.add_parser(
        "grants",
        help="list or revoke standing permission grants",
        description="List or revoke the standing permission grants ('always allow') in a store.",
    )
    grant_verbs = grants.add_subparsers(dest="verb", required=True)
    grant_list = grant_verbs.add_parser("list", help="standing grants, oldest first")
    grant_list.add_argument("--tenant", help="only this tenant's")
    grant_list.add_argument("--principal", metavar="ID", help="only this principal's")
    grant_list.add_argument("--tool", help="registration name")
    grant_list.add_argument("--json", action="store_true", help="one JSON document")
    revoke = grant_verbs.add_parser("revoke", help="remove a grant: its requests are asked again")
    revoke.add_argument("grant_id")
    for sub in (grant_list, revoke):
        sub.add_argument(
            "--store",
            required=True,
            help="the store's URL (sqlite:///PATH, PATH, postgresql://...)",
        )
    for sub in (listing, show, submit, cancel):
        where = sub.add_mutually_exclusive_group(required=True)
        where.add_argument(
            "--store", help="the store's URL (sqlite:///PATH, PATH, postgresql://...)"
        )
        where.add_argument("--temporal", metavar="HOST:PORT", help="a Temporal frontend")
        sub.add_argument("--namespace", default="default", help="with --temporal")
    serve = commands.add_parser(
        "mcp",
        help="serve a runtime's tools over MCP",
        description="Serve a runtime's tools over MCP: stdio, or streamable HTTP with --http.",
    )
    serve.add_argument("target", metavar="MODULE:RUNTIME", help="a Runtime or a factory")
    serve.add_argument("--store", help="the store's URL, passed to the factory as store=")
    serve.add_argument("--http", metavar="HOST:PORT", help="streamable HTTP on a loopback address")
    serve.add_argument("--inbox-url", help="the approval inbox, for nested resume schemas")
    serve.add_argument("--principal", metavar="ID@TENANT", help="who every call is for")
    http = commands.add_parser(
        "serve",
        help="serve the HTTP API and the approval inbox",
        description="Serve a runtime over HTTP (blade-runtime[http]) with its recovery loop; "
        "stops cleanly on SIGTERM. See blade_runtime.serving.serve.",
    )
    http.add_argument("target", metavar="MODULE:RUNTIME", help="a Runtime or a factory(store=)")
    http.add_argument("--store", required=True, help="the store's URL")
    http.add_argument("--host", default="127.0.0.1", help="address to bind")
    http.add_argument("--port", type=_port, default=8000, help="port to bind (0 to 65535)")
    http.add_argument("--auth", metavar="MODULE:FUNCTION", help="authenticate(request)")
    http.add_argument("--allow-anonymous", action="store_true", help="local development only")
    http.add_argument(
        "--allowed-host",
        action="append",
        metavar="HOST",
        help="a name requests may be addressed to, besides the loopback names and --host "
        "(repeatable; *.example.com for subdomains)",
    )
    http.add_argument(
        "--allowed-origin",
        action="append",
        metavar="ORIGIN",
        help="a site whose pages may send requests, e.g. https://app.example.com (repeatable)",
    )
    args = parser.parse_args(argv)
    if args.group == "serve":
        from blade_runtime.serving.serve import serve as run_serve

        return run_serve(
            args.target,
            store_url=args.store,
            host=args.host,
            port=args.port,
            auth=args.auth,
            allow_anonymous=args.allow_anonymous,
            allowed_hosts=args.allowed_host or (),
            allowed_origins=args.allowed_origin or (),
        )
    if args.group == "mcp":
        try:
            from blade_runtime.serving.mcp import run_cli
        except ImportError as missing:
            print(f"error: {missing}: pip install 'blade-runtime[mcp]'", file=sys.stderr)
            return EXIT_USAGE
        return run_cli(
            args.target,
            store_url=args.store,
            http=args.http,
            inbox_url=args.inbox_url,
            principal=args.principal,
        )
    unencodable = _unencodable_filter(args)
    if unencodable is not None:
        print(f"error: {unencodable}", file=sys.stderr)
        return EXIT_USAGE
    if getattr(args, "temporal", None):
        from blade_runtime.serving.temporal_cli import run_pending

        return run_pending(args)
    store = _open(args.store)
    if store is None:
        return EXIT_STORE
    try:
        if args.group == "grants":
            if args.verb == "list":
                return _grants(store, args.tenant, args.principal, args.tool, args.json)
            return _revoke(store, args.grant_id)
        if args.verb == "list":
            return _list(store, args.run, args.tool, args.json)
        if args.verb == "show":
            return _show(store, args.action_id)
        if args.verb == "submit":
            text = sys.stdin.read() if args.payload == "-" else args.payload
            return _submit(store, args.action_id, text)
        return _cancel(store, args.action_id, args.reason)
    finally:
        store.close()


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help as written (the usage lines and exit codes keep their lines), with each real default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and action.option_strings:
            text += f" (default: {action.default})"
        return text


class _Parser(argparse.ArgumentParser):
    """Every (sub)command's help in one style: subparsers inherit this class."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(**kwargs)


def _port(text: str) -> int:
    from blade_runtime.serving.serve import port_number

    port = port_number(text)
    if port is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0 to 65535)")
    return port


def _plain(doc: str | None) -> str:
    """The module docstring as help text: reST literals (``x``) shown as plain x."""
    return (doc or "").replace("``", "").strip()


def _unencodable_filter(args: argparse.Namespace) -> str | None:
    """What is wrong with a list's filter that has no UTF-8 form (a byte the locale could not
    decode reaches Python as a lone surrogate, which no store can look up), or None."""
    if args.verb != "list":
        return None
    for option in ("run", "tool", "tenant", "principal"):
        value = getattr(args, option, None)
        if isinstance(value, str) and not encodable(value):
            return f"--{option} {value!r} is not UTF-8 text: pass it in UTF-8 (or a UTF-8 locale)"
    return None


def _open(url: str) -> Store | None:
    """The store at ``url``, or None after one line on stderr (a missing SQLite file is not
    created: an operator's typo must not make an empty store)."""
    local = sqlite_path(url)
    if local is not None and not local.is_file():
        print(f"error: {masked(url)}: no store there", file=sys.stderr)
        return None
    try:
        return open_store(url, create=False)
    except StoreError as error:
        print(f"error: {error}", file=sys.stderr)
        return None


def _view(action: ActionRecord) -> dict[str, Any]:
    return {
        "action_id": action.action_id,
        "name": action.name if action.point is None else f"{action.name}.{action.point}",
        "state": action.state,
        "origin": {
            "name": action.name,
            "spec_id": action.spec_id,
            "call_id": action.call_id,
            "run_id": action.run_id,
            "point": action.point,
            "suspended_at": action.suspended_at,
        },
        "payload": action.payload,
        "submit_schema": action.submit_schema,
        "resume": action.resume,
        "resolved_at": action.resolved_at,
        "reason": action.reason,
        "tenant": action.tenant,
        "expires_at": action.expires_at,
    }


def listing(
    found: Sequence[T],
    as_json: bool,
    json_of: Callable[[T], Any],
    line_of: Callable[[T], str],
    none: str,
) -> int:
    """A list command's output: JSON, or a line each (``none`` when there are none, said where a
    person reads it; a script reading stdout finds it empty)."""
    if as_json:
        print(json.dumps([json_of(item) for item in found], indent=2, ensure_ascii=False))
        return 0
    if not found:
        print(none, file=sys.stderr)
    for item in found:
        print(line_of(item))
    return 0


def _list(store: Store, run: str | None, tool: str | None, as_json: bool) -> int:
    def line(action: ActionRecord) -> str:
        name = action.name if action.point is None else f"{action.name}.{action.point}"
        return (
            f"{action.action_id}  {name}  run={action.run_id}  call={action.call_id}  "
            f"since {action.suspended_at}"
        )

    found = store.actions(run_id=run, name=tool)
    return listing(found, as_json, _view, line, "no pending actions")


def _show(store: Store, action_id: str) -> int:
    action = store.action(action_id)
    if action is None:
        print(f"error: no action {action_id!r}", file=sys.stderr)
        return EXIT_REFUSED
    shown = _view(action)
    call = store.call(action.call_id)
    # what became of the call once the action was answered: resumable (a worker takes it up),
    # running, suspended again, or settled with its result
    shown["call"] = None if call is None else {"state": call.state, "result": call.result}
    print(json.dumps(shown, indent=2, ensure_ascii=False))
    return 0


def _submit(store: Store, action_id: str, text: str) -> int:
    action = store.action(action_id)
    if action is None:
        print(f"error: no action {action_id!r}", file=sys.stderr)
        return EXIT_REFUSED
    if action.state != "pending":
        print(f"error: {actions.already_resolved(action)}", file=sys.stderr)
        return EXIT_REFUSED
    if action.expires_at is not None and action.expires_at <= clock():
        resolution, event = actions.expiry(action)
        _resolve(store, action, resolution, event, "it expired before this submission")
        return EXIT_REFUSED
    try:
        value = checked(json.loads(text))
    except (ValueError, NotJson) as error:
        print(f"error: the payload is not JSON: {error}", file=sys.stderr)
        return EXIT_REFUSED
    invalid = actions.invalid_submission(action, value)
    if invalid is not None:
        print(f"error: {invalid}", file=sys.stderr)
        return EXIT_REFUSED
    if action.point is None:
        resolution, event = actions.completion(action, value)
        done = "the call completed with this output"
    else:
        resolution, event = actions.answer(action, value, owner=None)
        done = "a worker's recovery (loop or Runtime.recover()) resumes the call"
        if isinstance(value, dict) and value.get("decision") == "deny":
            done = "a worker's recovery (loop or Runtime.recover()) settles it as denied"
    refused = _resolve(store, action, resolution, event, done)
    call = None if refused else store.call(action.call_id)
    standing = None if call is None else grants.from_answer(action, value, call.context)
    if standing is not None:
        made = store.add_grant(standing)
        print(f"{made.grant_id}: {made.principal} always allows {made.tool} {made.subject!r}")
    return refused


def _grants(
    store: Store, tenant: str | None, principal: str | None, tool: str | None, as_json: bool
) -> int:
    def line(grant: GrantRecord) -> str:
        return (
            f"{grant.grant_id}  {grant.principal}@{grant.tenant}  {grant.tool} "
            f"({grant.spec_id}) {grant.point}  subject={grant.subject!r}  since {grant.created_at}"
        )

    found = store.grants(tenant=tenant, principal=principal, tool=tool)
    return listing(found, as_json, asdict, line, "no standing grants")


def _revoke(store: Store, grant_id: str) -> int:
    revoked = store.revoke_grant(grant_id)
    if revoked is None:
        print(f"error: no grant {grant_id!r}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"{grant_id}: revoked; {revoked.principal}'s {revoked.tool} requests are asked again")
    return 0


def _cancel(store: Store, action_id: str, reason: str) -> int:
    action = store.action(action_id)
    if action is None:
        print(f"error: no action {action_id!r}", file=sys.stderr)
        return EXIT_REFUSED
    resolution, event, _ = actions.cancellation(action, reason)
    return _resolve(store, action, resolution, event, "the call settled as cancelled")


def _resolve(store: Store, action: ActionRecord, resolution: Any, event: Any, done: str) -> int:
    try:
        store.resolve(action.action_id, resolution, event)
    except (ActionAlreadyResolved, UnknownAction) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"{action.action_id}: {resolution.state}; {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
