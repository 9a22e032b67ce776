"""``blade-runtime``: operators' access to pending actions and standing grants in a store.

    blade-runtime pending list --store URL [--run RUN] [--tool NAME] [--tenant T] [--json]
                               [--agent AGENT] [--thread THREAD] [--limit N] [--after CURSOR]
    blade-runtime pending show ACTION_ID --store URL
    blade-runtime pending submit ACTION_ID [JSON | -] --store URL
    blade-runtime pending cancel ACTION_ID --store URL [--reason TEXT]
    blade-runtime pending list|show|submit|cancel ... --temporal HOST:PORT [--namespace NS]
    blade-runtime grants list --store URL [--tenant T] [--principal ID] [--tool NAME] [--json]
                              [--limit N] [--after CURSOR]
    blade-runtime grants revoke GRANT_ID --store URL
    blade-runtime prune --store URL [--older-than 30d] [--keep N] [--dry-run]
    blade-runtime serve MODULE:RUNTIME --store URL [--host 127.0.0.1] [--port 8000]
                        [--auth MODULE:FUNCTION | --allow-anonymous]
                        [--allowed-host HOST ...] [--allowed-origin ORIGIN ...]
    blade-runtime mcp MODULE:RUNTIME [--store URL] [--http HOST:PORT] [--inbox-url URL]
                      [--principal ID@TENANT]
    blade-runtime serve|mcp MODULE:RUNTIME --temporal HOST:PORT [--namespace NS]
                            [--task-queue QUEUE] ...

URL is what ``blade_runtime.open_store`` takes: sqlite:///path.db, a plain file path, or
postgresql://user:password@host/db (``blade-runtime[postgres]``). The pending commands open
only a store a runtime has made (they never create one, nor add tables to another database);
serve and mcp, being runtimes, create it on their first start.

``mcp`` serves a runtime's tools over MCP (``blade-runtime[mcp]``): on stdio, or on streamable
HTTP at a loopback address; RUNTIME is a Runtime, or a function returning one (called with
``store=`` when --store is given).

``serve`` and ``mcp`` with ``--temporal`` serve tools that run on Temporal's workers
(``blade-runtime[temporal]``): RUNTIME is the registrations those workers run, each call a call
workflow on ``--task-queue``; ``serve`` adds the MCP endpoint at ``/mcp`` when
``blade-runtime[mcp]`` is installed. See docs/temporal.md.

A submission is validated exactly as the runtime validates it, against the schema recorded with
the action, before anything is written. Submitting a client tool's output settles its call; a
suspension's resume payload leaves the call resumable: a worker's recovery loop (or the next
``Runtime.recover()`` over the store) claims it and re-enters the implementation. Answering a
permission request with ``{"decision": "approve", "always": true}`` also makes a standing grant
(its principal, tool and subject are not asked again), which ``grants list`` shows and
``grants revoke`` removes.

Lists are pages, oldest first: at most --limit (default 100, at most 1,000); when there are
more, the line to run for the next page goes to stderr (``--after CURSOR``). ``prune`` deletes
settled calls (with their actions, ToolData, events, files and triggers) settled longer ago
than --older-than, or beyond the newest --keep; never a call that is running or waiting. It
prints what it removed (``--dry-run``: what it would remove).

With ``--temporal`` (``blade-runtime[temporal]``) the pending actions are those the call
workflows of ``blade_runtime.temporal`` hold: a submission is an update the workflow validates
before anything is recorded, and a worker resumes the call at once.

Exit codes: 0 done; 1 refused (invalid submission, unknown or already resolved action, unknown
grant); 2 usage (a list's filter that is not UTF-8 text, a cursor no page made, too); 3 the
store cannot be opened (or the Temporal server reached); 4 serve or mcp --http cannot listen on
the address (the port is in use, say).
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
from blade_runtime.core.records import MAX_PAGE_SIZE, PAGE_SIZE, Page, after_of, paged
from blade_runtime.core.retention import duration_s, prune_all
from blade_runtime.core.store import (
    ActionAlreadyResolved,
    ActionRecord,
    BadCursor,
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
    listing.add_argument("--tenant", help="only this tenant's")
    listing.add_argument("--agent", help="only those of calls this agent runs")
    listing.add_argument("--thread", help="only those of calls of this thread")
    listing.add_argument("--json", action="store_true", help="one JSON document")
    _paging(listing)
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
    _paging(grant_list)
    revoke = grant_verbs.add_parser("revoke", help="remove a grant: its requests are asked again")
    revoke.add_argument("grant_id")
    prune = commands.add_parser(
        "prune",
        help="delete settled history past a retention policy",
        description="Delete settled calls, with everything of theirs, settled longer ago than "
        "--older-than or beyond the newest --keep; never running or waiting work.",
    )
    prune.add_argument("--older-than", metavar="AGE", help="30d, 12h, 90m, 45s or 2w")
    prune.add_argument("--keep", type=_count, metavar="N", help="keep the newest N settled calls")
    prune.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    for sub in (grant_list, revoke, prune):
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
        description="Serve a runtime's tools over MCP (or tools on Temporal's workers with "
        "--temporal): stdio, or streamable HTTP with --http.",
    )
    serve.add_argument("target", metavar="MODULE:RUNTIME", help="a Runtime or a factory")
    served = serve.add_mutually_exclusive_group()
    served.add_argument("--store", help="the store's URL, passed to the factory as store=")
    _temporal(served, serve)
    serve.add_argument("--http", metavar="HOST:PORT", help="streamable HTTP on a loopback address")
    serve.add_argument("--inbox-url", help="the approval inbox, for nested resume schemas")
    serve.add_argument("--principal", metavar="ID@TENANT", help="who every call is for")
    serve.add_argument(
        "--sessions",
        action="store_true",
        help="with --http: keep MCP sessions (older protocol versions' in-request elicitation "
        "and log level need them; a session stays on one worker)",
    )
    bounds = serve.add_argument_group("bounds (see blade_runtime.serving.mcp_cli)")
    bounds.add_argument("--max-message-bytes", type=_positive, metavar="N", default=4 << 20)
    bounds.add_argument("--max-in-flight", type=_positive, metavar="N", default=64, help="stdio")
    bounds.add_argument("--max-connections", type=_positive, metavar="N", default=256)
    bounds.add_argument("--request-timeout", type=float, metavar="S", default=10.0)
    bounds.add_argument("--grace", type=float, metavar="S", default=5.0, help="after SIGTERM")
    http = commands.add_parser(
        "serve",
        help="serve the HTTP API and the approval inbox",
        description="Serve a runtime over HTTP (blade-runtime[http]) with its recovery loop, "
        "or tools on Temporal's workers with --temporal (and MCP at /mcp); stops cleanly on "
        "SIGTERM. See blade_runtime.serving.serve.",
    )
    http.add_argument("target", metavar="MODULE:RUNTIME", help="a Runtime or a factory(store=)")
    api = http.add_mutually_exclusive_group(required=True)
    api.add_argument("--store", help="the store's URL")
    _temporal(api, http)
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
    if args.group == "serve" and args.temporal is not None:
        from blade_runtime.serving.serve import serve_temporal

        return serve_temporal(
            args.target,
            temporal=args.temporal,
            namespace=args.namespace,
            task_queue=args.task_queue,
            **_serving(args),
        )
    if args.group == "serve":
        from blade_runtime.serving.serve import serve as run_serve

        return run_serve(args.target, store_url=args.store, **_serving(args))
    if args.group == "mcp":
        try:
            from blade_runtime.serving.mcp_cli import Bounds, TemporalPlace, run_cli
        except ImportError as missing:
            print(f"error: {missing}: pip install 'blade-runtime[mcp]'", file=sys.stderr)
            return EXIT_USAGE
        return run_cli(
            args.target,
            store_url=args.store,
            http=args.http,
            inbox_url=args.inbox_url,
            principal=args.principal,
            sessions=args.sessions,
            temporal=(
                None
                if args.temporal is None
                else TemporalPlace(args.temporal, args.namespace, args.task_queue)
            ),
            bounds=Bounds(
                args.max_message_bytes,
                args.max_in_flight,
                args.max_connections,
                args.request_timeout,
                args.grace,
            ),
        )
    unencodable = _unencodable_filter(args)
    if unencodable is not None:
        print(f"error: {unencodable}", file=sys.stderr)
        return EXIT_USAGE
    if getattr(args, "temporal", None):
        from blade_runtime.serving.temporal_cli import run_pending

        return run_pending(args)
    older_than_s = None
    if args.group == "prune":
        if args.older_than is None and args.keep is None:
            print("error: prune: give --older-than AGE, --keep N, or both", file=sys.stderr)
            return EXIT_USAGE
        try:
            older_than_s = None if args.older_than is None else duration_s(args.older_than)
        except ValueError as error:
            print(f"error: --older-than: {error}", file=sys.stderr)
            return EXIT_USAGE
    store = _open(args.store)
    if store is None:
        return EXIT_STORE
    try:
        if args.group == "prune":
            return _prune(store, older_than_s, args.keep, args.dry_run)
        if args.group == "grants":
            if args.verb == "list":
                return _grants(store, args)
            return _revoke(store, args.grant_id)
        if args.verb == "list":
            return _list(store, args)
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


def _serving(args: argparse.Namespace) -> dict[str, Any]:
    """``serve``'s options of where and to whom it answers, with or without ``--temporal``."""
    return {
        "host": args.host,
        "port": args.port,
        "auth": args.auth,
        "allow_anonymous": args.allow_anonymous,
        "allowed_hosts": args.allowed_host or (),
        "allowed_origins": args.allowed_origin or (),
    }


def _temporal(where: Any, command: argparse.ArgumentParser) -> None:
    """``--temporal`` (beside ``--store`` in ``where``), its namespace and the workers' queue."""
    where.add_argument(
        "--temporal",
        metavar="HOST:PORT",
        help="a Temporal frontend: the tools run on its workers (RUNTIME: their registrations)",
    )
    command.add_argument("--namespace", default="default", help="with --temporal")
    command.add_argument("--task-queue", default="blade", help="with --temporal: the workers'")


def _paging(listing: argparse.ArgumentParser) -> None:
    listing.add_argument("--limit", type=_count, default=PAGE_SIZE, help="records on the page")
    listing.add_argument("--after", metavar="CURSOR", help="the next page (stderr names it)")


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (0, 1, 2, ...)")
    return int(text)


def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit() and int(text) > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


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
    if getattr(args, "verb", None) != "list":
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
            "thread_id": action.thread_id,
            "agent_id": action.agent_id,
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
    *,
    first: bool = True,
    more: str | None = None,
) -> int:
    """A list command's output: JSON, or a line each (``none`` when the first page has none,
    said where a person reads it; a script reading stdout finds it empty); ``more``: the cursor
    of the next page, whose command line goes to stderr."""
    if as_json:
        print(json.dumps([json_of(item) for item in found], indent=2, ensure_ascii=False))
    else:
        if not found and first:
            print(none, file=sys.stderr)
        for item in found:
            print(line_of(item))
    if more is not None:
        print(f"more: add --after {more} for the next page", file=sys.stderr)
    return 0


def _paged_listing(
    page: Page[T],
    args: argparse.Namespace,
    json_of: Callable[[T], Any],
    line_of: Callable[[T], str],
    none: str,
) -> int:
    return listing(
        page.items, args.json, json_of, line_of, none, first=args.after is None, more=page.next
    )


def _page(
    read: Callable[..., list[T]], args: argparse.Namespace, key: Callable[[T], str]
) -> Page[T] | None:
    """One page of a store listing (None after one line on stderr: a cursor no page made)."""
    try:
        size = max(1, min(args.limit, MAX_PAGE_SIZE))
        return paged(read(limit=size + 1, after=after_of(args.after)), size, key)
    except BadCursor as error:
        print(f"error: --after: {error}", file=sys.stderr)
        return None


def _list(store: Store, args: argparse.Namespace) -> int:
    def line(action: ActionRecord) -> str:
        name = action.name if action.point is None else f"{action.name}.{action.point}"
        placed = "".join(
            f"  {key}={value}"
            for key, value in (("agent", action.agent_id), ("thread", action.thread_id))
            if value is not None
        )
        return (
            f"{action.action_id}  {name}  run={action.run_id}  call={action.call_id}{placed}  "
            f"since {action.suspended_at}"
        )

    def read(**page: Any) -> list[ActionRecord]:
        return store.actions(
            run_id=args.run,
            name=args.tool,
            tenant=args.tenant,
            agent_id=args.agent,
            thread_id=args.thread,
            **page,
        )

    found = _page(read, args, lambda action: action.action_id)
    if found is None:
        return EXIT_USAGE
    return _paged_listing(found, args, _view, line, "no pending actions")


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


def _grants(store: Store, args: argparse.Namespace) -> int:
    def line(grant: GrantRecord) -> str:
        return (
            f"{grant.grant_id}  {grant.principal}@{grant.tenant}  {grant.tool} "
            f"({grant.spec_id}) {grant.point}  subject={grant.subject!r}  since {grant.created_at}"
        )

    def read(**page: Any) -> list[GrantRecord]:
        return store.grants(tenant=args.tenant, principal=args.principal, tool=args.tool, **page)

    found = _page(read, args, lambda grant: grant.grant_id)
    if found is None:
        return EXIT_USAGE
    return _paged_listing(found, args, asdict, line, "no standing grants")


def _prune(store: Store, older_than_s: float | None, keep: int | None, dry_run: bool) -> int:
    pruned = prune_all(store, older_than_s, keep, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    print(
        f"{verb} {pruned.calls} settled calls, {pruned.actions} actions, {pruned.data} ToolData "
        f"items, {pruned.events} events, {pruned.files} files, {pruned.triggers} triggers, "
        f"{pruned.effects} effects ({pruned.bytes} bytes of payloads and files)"
    )
    return 0


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


def console() -> None:
    """The ``blade-runtime`` command: ``main``'s exit code, whatever the interpreter's exit."""
    code = main()
    if "temporalio.bridge" in sys.modules:
        from blade_runtime.serving.temporal_cli import exit_now

        exit_now(code)
    sys.exit(code)


if __name__ == "__main__":
    console()
