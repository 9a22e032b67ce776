"""Stores: where calls, pending actions, ToolData and events live.

A store is a small transactional interface. Each method is one transaction: resolving an action,
recording what follows from it and appending its event happen together or not at all, and every
state change is a compare-and-set, so of many concurrent submits or claims exactly one wins.
The rules of every transition are written once (``blade_runtime.stores.sql``) and each engine
executes them: ``MemoryStore`` (``blade_runtime.stores.memory``, a private in-memory database of
this process), ``SQLiteStore`` (``blade_runtime.stores.sqlite``, the embedded durable default) and
``PostgresStore`` (``blade_runtime.stores.postgres``, shared by workers on many machines).
``open_store(url)`` opens any.

Call states: ``running`` (an entry of the implementation has begun; written before it runs, and
held by its ``owner`` under a lease until ``lease_until``), ``suspended`` (waiting on a pending
action), ``pending`` (a client tool waiting for its output), ``resumable`` (its action was
submitted, no runtime has claimed the re-entry yet) and ``settled``.

Leases: a lease's expiry is the store's clock when it commits the grant plus its length (``begin``,
``claim``, ``renew``, ``resolve`` with a ``call_owner``), never a time read before a wait for a
lock; and a running call's lease counts as expired only if it had expired before the claim began
waiting, so a sweep held up by the same lock as an owner's renewal never takes that owner's calls.

Ownership and fencing: only the entry that holds a running call (its owner, under its fencing
token: a ``Claim``) may write for it: its ToolData, files, triggers, suspension and result. A
runtime that lost its lease is told so, with ``LeaseLost``, and nothing it reports is recorded.
Another runtime takes a call over only through ``claim``: a resumable call, or a running one
whose lease expired or whose owner is known dead.

Volume: every listing is a page (a limit, and the last record of the page before), narrowed to a
tenant and a principal in the query; settled history is deleted by ``prune`` (a time and a row
threshold, in batches, never running or waiting work).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TypeAlias

from pydantic import JsonValue

from blade_runtime.core.spec import JsonObject

CallState: TypeAlias = Literal["running", "suspended", "pending", "resumable", "settled"]
ActionState: TypeAlias = Literal["pending", "submitted", "cancelled", "failed", "expired"]
TriggerState: TypeAlias = Literal["pending", "claimed", "delivered", "failed"]

DEFAULT_LEASE_S = 5.0
"""How long a claim on a running call holds without a heartbeat (renewed every third of it)."""


def patience(lease_s: float) -> float:
    """How long a sweep may wait for the store and still judge lapsed leases: a tenth of a
    lease, and at least 0.1 s (a sweep's own reads take tens of milliseconds on a busy machine:
    with less, short leases would lapse for no sweep at all). One that waited longer was held
    up by a lock that may have held up the owners' renewals too (their leases lapse behind it,
    and are renewed as it ends); it leaves their calls to the next sweep."""
    return max(lease_s / 10, 0.1)


def lapsed_before(began: float, granted: float, waited_s: float, lease_s: float) -> float:
    """The clock reading a lease must have ended before for a sweep to claim its call: when the
    sweep began waiting for the store (``waited_s`` before its claim ``began``, for its earlier
    reads), or never (-inf) once the wait up to its locks being ``granted`` exceeds patience."""
    if granted - began + waited_s > patience(lease_s):
        return float("-inf")
    return began - waited_s


# How the durable stores write JSON: ASCII, so any Python string round-trips, a lone surrogate
# included (as a \u escape), where UTF-8 text would refuse it; and the C encoder is fastest so.
_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False)
# That C encoder made once, not on every call as JSONEncoder.encode makes it: making it is most
# of the cost of encoding a small document, and a cycle encodes about 15 of them. No
# circular check (a shared one would keep stale ids after a failed encode): JSON values are
# trees, and a cycle still fails (RecursionError).
_make_c_encoder = getattr(json.encoder, "c_make_encoder", None)
_c_encode = (
    None
    if _make_c_encoder is None
    else _make_c_encoder(
        None,  # markers: no circular check
        _encoder.default,  # raises TypeError for what has no JSON form
        json.encoder.encode_basestring_ascii,
        None,  # indent
        ":",
        ",",
        False,  # sort_keys
        False,  # skipkeys
        False,  # allow_nan
    )
)


def dump_json(value: Any) -> str:
    """``value`` as compact ASCII JSON; NaN and infinities refused (``ValueError``), as is what
    has no JSON form (``TypeError``) and a value that contains itself (``RecursionError``, where
    json.dumps says ``ValueError``: the runtime's values are checked JSON trees before this)."""
    if isinstance(value, str):
        return json.encoder.encode_basestring_ascii(value)
    if _c_encode is None:  # an interpreter without json's C accelerator
        return _encoder.encode(value)
    return "".join(_c_encode(value, 0))


# json's C scanner, without json.loads's checks around it (typeshed leaves the attribute out).
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def load_json(text: str | None) -> Any:
    """``text`` parsed; a document the scanner does not take whole (surrounding whitespace,
    trailing text, nothing) goes to json.loads, which parses it or says why not."""
    if text is None:
        return None
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


def storable_id(identifier: str) -> bool:
    """An id every store holds and indexes alike (1 to 200 printable characters): PostgreSQL's
    text has no NUL, UTF-8 no lone surrogate, a btree index entry at most 2,704 bytes."""
    return 0 < len(identifier) <= 200 and identifier.isprintable()


def encodable(text: str) -> bool:
    """Whether ``text`` has a UTF-8 form (no lone surrogate): a durable store's lookup by an id
    without one finds nothing, as MemoryStore's does, instead of raising the driver's error."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def now() -> str:
    """A timestamp for records and events (ISO 8601, UTC)."""
    return datetime.now(UTC).isoformat()


def clock() -> float:
    """Seconds since the epoch: leases and deadlines are compared across processes and hosts."""
    return time.time()


@dataclass(frozen=True, slots=True)
class Claim:
    """The claim one entry of a call runs under: the call's owner and its fencing token (1 at
    its start, one more at every claim and re-entry). Every write the entry makes (its ToolData,
    files, triggers, events, suspension and result) carries it, and the store refuses it with
    ``LeaseLost`` once another worker holds the call: nothing a stale worker reports is
    recorded. A child tool's writes carry its parent entry's claim."""

    call_id: str
    owner: str
    fence: int


@dataclass(slots=True)
class CallRecord:
    """One tool call as stored. ``entry`` is null for the initial entry, else the resume."""

    call_id: str
    run_id: str
    name: str
    spec_id: str
    side_effect: str
    execution: str
    input: JsonObject
    state: CallState
    started_at: str
    owner: str = ""
    entry: JsonValue = None
    result: JsonValue = None
    lease_until: float = 0.0
    tenant: str = ""
    context: JsonValue = None  # the CallContext as stored (principal, client data, thread)
    kind: str | None = None  # the kind its start was decided with (narrowed, or the spec's)
    fence: int = 0  # the fencing token: 1 at its start, one more at every claim and re-entry
    principal: str = ""  # the id of the principal it was made for ("" for nobody)
    settled_at: float | None = None  # epoch seconds of the store's clock when it settled

    @property
    def claim(self) -> Claim:
        """The claim of the entry that holds it now."""
        return Claim(self.call_id, self.owner, self.fence)


@dataclass(slots=True)
class ActionRecord:
    """A pending action: a suspension (``point`` set) or a client tool's output (``point`` None).

    ``payload`` is what the action shows (the suspend payload, or the client tool's input);
    ``submit_schema`` validates what resolves it (the resume schema, or the output schema), and
    is stored so that an operator tool can validate a submission without the implementation.
    ``tenant`` and ``principal`` are its call's: whose it is; ``thread_id`` and ``agent_id``
    too (its origin: the thread the call belongs to, the agent that ran it).
    """

    action_id: str
    call_id: str
    run_id: str
    name: str
    spec_id: str
    point: str | None
    payload: JsonValue
    submit_schema: JsonObject
    suspended_at: str
    state: ActionState = "pending"
    resume: JsonValue = None
    resolved_at: str | None = None
    reason: str | None = None
    tenant: str = ""
    expires_at: float | None = None  # epoch seconds; past it the action settles as TIMEOUT
    principal: str = ""
    thread_id: str | None = None
    agent_id: str | None = None


@dataclass(slots=True)
class GrantRecord:
    """A standing permission grant: ``principal`` (of ``tenant``) always allows ``tool`` (a
    registration name, while it runs ``spec_id``) to act on ``subject`` without asking a person
    again, at ``point``: ``@permission`` (the call as a whole, before it runs; subject "") or
    ``@permission-step`` (a step the tool asks about with ``ctx.request_permission``)."""

    grant_id: str
    tenant: str
    principal: str
    tool: str
    subject: str
    created_at: str
    action_id: str | None = None  # the permission request whose "always allow" answer made it
    spec_id: str = ""
    point: str = "@permission"


@dataclass(slots=True)
class DataRecord:
    """One ToolData item; ``seq`` keeps the order of first writes."""

    call_id: str
    channel: str
    item_id: str
    value: JsonValue
    updated_at: str
    seq: int = 0


@dataclass(frozen=True, slots=True)
class Event:
    """One tool event of a run, in order: started, waiting and acquired (a concurrency slot or
    a lock), data, suspended, pending, resumed, claimed, trigger, result (stored, numbered by
    ``seq`` in commit order), and progress and messages
    (never stored, ``seq`` 0). ``tenant`` and ``principal`` are its call's: who may see it.
    A store hands back the event it committed, numbered; it never changes the one it was given."""

    run_id: str
    call_id: str
    kind: str
    payload: JsonValue
    at: str
    seq: int = 0
    tenant: str = ""
    principal: str = ""

    def numbered(self, seq: int) -> Event:
        """This event as committed, numbered ``seq`` (``dataclasses.replace`` costs 7 times
        as much, on every commit)."""
        return Event(
            self.run_id, self.call_id, self.kind, self.payload, self.at, seq, self.tenant,
            self.principal,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class SlotRecord:
    """One call's place in the queue of one slot key (``core.slots``): a concurrency slot of a
    tool or a resource lock, ``held`` or waiting behind those of lower ``ticket``, under its
    ``owner``'s lease until ``lease_until`` (the store's clock; a lapsed one counts for nothing).
    """

    slot_key: str
    call_id: str
    owner: str
    ticket: float
    capacity: int
    held: bool
    lease_until: float
    tenant: str = ""
    run_id: str = ""
    name: str = ""


@dataclass(slots=True)
class FileRecord:
    """A file a tool saved (``ctx.files.save``), without its content. ``tenant``, ``creator``
    (the principal's id) and ``thread_id`` come from the call's stored caller context."""

    file_id: str
    tenant: str
    name: str
    media_type: str
    size: int
    sha256: str
    created_at: str
    call_id: str
    run_id: str
    creator: str | None = None
    thread_id: str | None = None


@dataclass(slots=True)
class TriggerRecord:
    """A tool's request to continue generation on its call's thread (``ctx.trigger``).

    ``pending`` until a runtime with an ``on_trigger`` handler claims it (``claimed``, by
    ``owner`` until ``claimed_until``), then ``delivered`` or ``failed`` (the handler raised)."""

    trigger_id: str
    call_id: str
    run_id: str
    name: str
    tenant: str
    input: JsonValue
    created_at: str
    context: JsonValue = None  # the call's CallContext as stored
    thread_id: str | None = None
    state: TriggerState = "pending"
    owner: str = ""
    claimed_until: float = 0.0
    finished_at: str | None = None
    error: str | None = None


EffectKind = Literal["context_patch", "message", "permission"]


@dataclass(slots=True)
class EffectRecord:
    """An effect a tool emitted while it ran (``ctx.effects``, see ``core.effects``), kept with
    its run: a context patch, a message, or a permission change (``kind``), and its ``value``;
    ``tenant`` and ``principal`` are its call's, and only their reads find it."""

    effect_id: str
    run_id: str
    call_id: str
    tenant: str
    principal: str
    kind: EffectKind
    value: JsonValue
    at: str


def made_by(call: CallRecord, names: Collection[str] | Mapping[str, str]) -> bool:
    """Whether ``call`` is of a registration in ``names`` (a mapping: of that name and spec)."""
    if isinstance(names, Mapping):
        return names.get(call.name) == call.spec_id
    return call.name in names


def claimable(
    call: CallRecord,
    lapsed: float,
    dead: Collection[str],
    names: Collection[str] | Mapping[str, str] | None,
    owner: str = "",
    running: Collection[str] = (),
) -> bool:
    """The one rule of a claim: a resumable call, or a running one whose lease ended before
    ``lapsed`` (see ``lapsed_before``) or whose owner is known ``dead``; of a registration in
    ``names`` when given (the tools the claiming runtime can run); never a call the claiming
    ``owner`` is ``running`` itself (a late heartbeat of its own is no reason to run it twice)."""
    if names is not None and not made_by(call, names):
        return False
    if call.owner == owner and call.call_id in running:
        return False
    if call.state == "resumable":
        return True
    return call.state == "running" and (call.lease_until < lapsed or call.owner in dead)


class StoreError(Exception):
    """A store operation that cannot be carried out."""


class UnknownAction(StoreError):
    def __init__(self, action_id: str) -> None:
        super().__init__(f"no pending action {action_id!r}")
        self.action_id = action_id


class DuplicateCall(StoreError):
    """``begin`` of a call id the store already holds."""

    def __init__(self, call_id: str) -> None:
        super().__init__(f"call id {call_id!r} is already recorded")
        self.call_id = call_id


class StoreUnavailable(StoreError):
    """The store cannot be opened or reached; the message names it (password masked)."""


class StoreBusy(StoreError):
    """The store would have to wait for a lock (within ``Store.nowait()``); nothing was done."""


class SaveStopped(StoreError):
    """``save_file`` was told not to keep the file (its call was cancelled): nothing stored."""


class BadCursor(StoreError):
    """A listing's ``after`` names no record the listing could have returned (another
    principal's, pruned since, or never one): start from the first page again."""


class LeaseLost(StoreError):
    """A runtime wrote to a call it no longer owns: another worker claimed it (its lease expired,
    or its owner was taken for dead). The write is not made."""

    def __init__(self, call_id: str, owner: str) -> None:
        super().__init__(f"call {call_id} is no longer owned by {owner}: another worker claimed it")
        self.call_id = call_id
        self.owner = owner


class ActionAlreadyResolved(StoreError):
    """Another submit, cancel or fail won: ``action`` says how it was resolved, and when."""

    def __init__(self, action: ActionRecord) -> None:
        super().__init__(
            f"action {action.action_id} was already {action.state} at {action.resolved_at}"
        )
        self.action = action


@dataclass(frozen=True, slots=True)
class Resolution:
    """What resolving an action does to its call, in the same transaction."""

    state: ActionState
    resolved_at: str
    resume: JsonValue = None
    reason: str | None = None
    call_state: CallState = "resumable"
    call_entry: JsonValue = None
    call_result: JsonValue = None
    call_owner: str | None = None  # the runtime that re-enters the call, when it does
    lease_s: float = DEFAULT_LEASE_S  # how long that runtime's claim holds
    call_input: JsonObject | None = None  # a permission answer's edited input, stored with it
    # the behaviour narrowed again for that edited input (None: the call's stays)
    call_kind: str | None = None
    call_side_effect: str | None = None
    only_if_expired: bool = False  # an expiry: resolve only once ``expires_at`` has passed


@dataclass(frozen=True, slots=True)
class Begun:
    """A call's start as committed: its lease (the store's clock at the commit plus the lease's
    length) and its event, numbered."""

    lease_until: float
    event: Event


@dataclass(frozen=True, slots=True)
class Resolved:
    """A resolution that won: the action as it now is, its call's input and caller's context
    (for re-entry), and the event as committed."""

    action: ActionRecord
    call_input: JsonObject
    call_context: JsonValue = None
    call_fence: int = 0  # the call's fencing token after it (one more when it is re-entered)
    event: Event | None = None
    call_kind: str | None = None  # the call's behaviour as stored (narrowed, or the spec's)
    call_side_effect: str | None = None


@dataclass(frozen=True, slots=True)
class Claimed:
    """A call this runtime now owns, what it was before the claim (to decide what to do), and
    the ``claimed`` event committed with it."""

    call: CallRecord
    was: CallState
    previous_owner: str
    event: Event | None = None


@dataclass(frozen=True, slots=True)
class Pruned:
    """What one ``prune`` removed (or, a dry run, would remove): settled calls, and with them
    their actions, ToolData items, events, files, triggers and effects; ``bytes`` of payload
    and file content among them (an estimate of the space given back)."""

    calls: int = 0
    actions: int = 0
    data: int = 0
    events: int = 0
    files: int = 0
    triggers: int = 0
    bytes: int = 0
    effects: int = 0

    def __add__(self, other: Pruned) -> Pruned:
        return Pruned(
            *(getattr(self, name) + getattr(other, name) for name in self.__dataclass_fields__)
        )


class Renewer(Protocol):
    """Lease renewal on a connection of its own (``Store.renewer()``): a store whose pool or
    event loop is stalled does not hold it up. It may be called from any one thread at a time,
    another than the one that made the store."""

    def renew(self, owner: str, lease_s: float) -> set[str]:
        """As ``Store.renew``."""
        ...

    def close(self) -> None:
        """Close its connection (a later ``renew`` is refused, or opens one again)."""
        ...


class Store(Protocol):
    """The runtime's persistence. Every method is atomic; the runtime adds no locking. Every
    method may be called from any thread (a durable store's connections are per thread or
    pooled). A method never changes a record or event it is handed: it returns what it made.

    Listings are pages: at most ``limit`` records (None: all), in a fixed order by keys that
    never change, after the record named by ``after`` (the id of the last record of the page
    before; ``BadCursor`` when the listing could not have returned it), narrowed in the query to
    ``tenant`` and, within it, to the records made for ``principal`` or for nobody."""

    durable: bool
    """Whether records outlive the process and are shared with other processes."""

    waits: bool
    """Whether an operation may block on a lock or a connection (SQLite, PostgreSQL), so that an
    event loop should not run it on its own thread unless within ``nowait()``; MemoryStore's
    operations never wait."""

    inline_first: bool
    """Whether a waiting store's operation is worth trying on the event loop first, within
    ``nowait()`` (SQLite: an uncontended commit is a local file write, cheaper than a thread hop;
    PostgreSQL: no, every statement is a round trip to the server)."""

    url: str
    """Where the store is, as ``open_store`` takes it (any password masked)."""

    # -- a call's life: each one transaction with its event ------------------------------------

    def begin(self, call: CallRecord, event: Event, *, lease_s: float = DEFAULT_LEASE_S) -> Begun:
        """Record a new call running under ``call.owner`` with fencing token ``call.fence``; its
        lease runs ``lease_s`` from the commit (a call recorded in another state keeps the
        ``lease_until`` it has). ``DuplicateCall`` when its id is recorded already."""
        ...

    def suspend(
        self, call: CallRecord, action: ActionRecord, event: Event, *, claim: Claim | None = None
    ) -> Event:
        """Store the pending ``action`` and its call, now ``call.state`` (suspended or pending).
        With ``claim``, the store holds the call already, running under that claim (``LeaseLost``
        otherwise); without, the call is recorded here for the first time."""
        ...

    def resolve(self, action_id: str, resolution: Resolution, event: Event) -> Resolved:
        """Compare-and-set the pending action, update its call, append ``event``. With a
        ``call_owner``, the call's lease runs ``resolution.lease_s`` from the commit and its
        fencing token goes one up."""
        ...

    def settle(self, claim: Claim, result: JsonValue, event: Event) -> Event:
        """Settle the running call held under ``claim`` (``LeaseLost`` when it is not)."""
        ...

    def claim(
        self,
        owner: str,
        lease_s: float,
        *,
        dead: Collection[str] = (),
        names: Collection[str] | Mapping[str, str] | None = None,
        call_id: str | None = None,
        limit: int = 100,
        waited_s: float = 0.0,
        running: Collection[str] = (),
    ) -> list[Claimed]:
        """Take over calls another runtime cannot finish (``claimable``), each with a
        ``claimed`` event, in one transaction per sweep: resumable calls, and running calls
        whose lease expired or whose owner is in ``dead``; ``names``: only calls of these
        registration names (given as a mapping of name to spec id, only those made with that
        spec); ``call_id``: only that call. Concurrent sweeps never share a call. A lease is
        expired only if it had expired before the sweep began waiting for the store
        (``waited_s`` before its claim was sent, for its earlier reads), and a sweep that waited
        longer than ``patience(lease_s)`` claims no lapsed lease at all (``lapsed_before``).
        The claimed calls' leases run ``lease_s`` from the commit; their fencing tokens go up.
        ``running``: ids of calls ``owner`` is running itself: never claimed by it (its own
        heartbeat was late, it did not lose them), whatever their lease says."""
        ...

    def renew(self, owner: str, lease_s: float) -> set[str]:
        """Extend the lease of every running call ``owner`` holds to the store's clock at the
        commit plus ``lease_s``; returns their ids."""
        ...

    def renewer(self) -> Renewer:
        """A ``Renewer`` with a connection of its own, for a heartbeat thread."""
        ...

    def held(self, claim: Claim) -> bool:
        """Whether the call is still running under ``claim``, its lease not expired by the
        store's clock (``ctx.lease.assert_held``)."""
        ...

    def write_data(
        self, record: DataRecord, event: Event | None, *, claim: Claim | None = None
    ) -> Event | None:
        """Insert or update (same call, channel and item id: in place) one ToolData item, with
        its event (returned, numbered). ``claim``: the entry writing it must still hold its call
        (``LeaseLost`` otherwise, and nothing is written); None for a call no store records."""
        ...

    def save_file(
        self,
        record: FileRecord,
        content: bytes,
        *,
        claim: Claim | None = None,
        keep: Callable[[], bool] | None = None,
    ) -> None:
        """Store a file and its content in one transaction; ``claim`` as for ``write_data``;
        ``keep`` is asked just before the commit, and when it says False nothing is stored
        (``SaveStopped``)."""
        ...

    def delete_file(self, file_id: str) -> bool:
        """Remove a file (a save its caller gave up on after the commit); whether it was there."""
        ...

    def add_trigger(
        self, trigger: TriggerRecord, event: Event, *, claim: Claim | None = None
    ) -> Event | None:
        """Record a pending trigger and append its event (returned); None (nothing written) when
        one of its id is recorded already (a replayed entry asks again). ``claim`` as for
        ``write_data``."""
        ...

    def add_effect(
        self,
        effect: EffectRecord,
        event: Event,
        *,
        claim: Claim | None = None,
        grant: GrantRecord | None = None,
        revoke: GrantRecord | None = None,
    ) -> Event | None:
        """Record an effect, apply what it changes in the store (``grant``: a standing grant
        to add, kept as ``add_grant`` keeps one; ``revoke``: the grant of that identity to
        remove) and append its event (returned), in one transaction; None (nothing written)
        when one of its id is recorded already (a replayed entry emits it again). ``claim`` as
        for ``write_data``."""
        ...

    def effects(
        self,
        run_id: str,
        *,
        tenant: str,
        principal: str,
        kind: EffectKind | None = None,
        limit: int | None = None,
        call_id: str | None = None,
    ) -> list[EffectRecord]:
        """The effects of ``run_id``'s calls made for ``tenant`` and ``principal`` (of that
        ``kind``; of one outer call and its children: ``call_id``), in their events' order."""
        ...

    # -- concurrency slots and resource locks (core.slots) ---------------------------------------

    def announce(self, event: Event, *, claim: Claim) -> Event:
        """Append ``event`` of the call the entry holding ``claim`` runs (``LeaseLost`` when it
        no longer holds it); returned numbered. A call's ``waiting`` and ``acquired``."""
        ...

    def acquire_slots(
        self, entry: SlotRecord, keys: Sequence[tuple[str, int]], lease_s: float
    ) -> bool:
        """Queue ``entry``'s call (first time: its ticket is the store's clock) on each of
        ``keys`` (key, capacity) and take them all at once if, on every key, fewer than its
        capacity of live rows are held or queued ahead of it; else take none. Renews its rows'
        lease either way and forgets the lapsed rows of those keys. One transaction."""
        ...

    def release_slots(self, call_id: str, owner: str) -> int:
        """Leave every queue ``call_id`` is in under ``owner`` (held or waiting); how many.
        The lapsed rows of every key go too."""
        ...

    def renew_slots(self, owner: str, call_ids: Collection[str], lease_s: float) -> set[str]:
        """Extend the lease of the slot rows of ``call_ids`` under ``owner`` (the store's clock
        at the commit plus ``lease_s``); the ids of the calls that still have one."""
        ...

    def slots(self, *, tenant: str | None = None, call_id: str | None = None) -> list[SlotRecord]:
        """The live slot rows (by key; held, then waiting in ticket order) of ``tenant`` or of
        one call: who holds a key and who waits for it, in every worker of the store."""
        ...

    # -- sweeps and liveness -------------------------------------------------------------------

    def nowait(self) -> contextlib.AbstractContextManager[None]:
        """Within it, on the calling thread, an operation that would wait for a lock raises
        ``StoreBusy`` instead, having written nothing (SQLite). A no-op where operations never
        wait (MemoryStore) or are always run off the event loop (PostgreSQL)."""
        ...

    def expired(self, limit: int = 100) -> list[ActionRecord]:
        """Pending actions whose ``expires_at`` has passed."""
        ...

    def owners(self) -> set[str]:
        """The owners of running calls whose lease has not expired (candidates for a liveness
        check: an owner known dead loses its calls before its lease runs out). A backend may
        name more, or briefly fewer, owners (see its own docstring): each is only checked, and
        an owner left out is examined by the next sweep anyway."""
        ...

    def alive(self, owner: str) -> bool | None:
        """Whether the runtime ``owner`` still runs, if the store can tell (None: it cannot)."""
        ...

    def attach(self, owner: str) -> None:
        """A runtime ``owner`` starts using the store (PostgreSQL holds a session advisory lock
        for it, which shows its death to other hosts)."""
        ...

    def detach(self, owner: str) -> None: ...

    def claim_triggers(
        self, owner: str, lease_s: float, *, limit: int = 100
    ) -> list[TriggerRecord]:
        """Claim pending triggers (and claimed ones whose claim expired), oldest first, each for
        ``lease_s``; concurrent claims never share one."""
        ...

    def finish_trigger(self, trigger_id: str, owner: str, *, error: str | None = None) -> bool:
        """Mark a trigger ``owner`` holds delivered (or failed, with ``error``); False when the
        claim was lost."""
        ...

    def prune(
        self,
        *,
        settled_before: float | None = None,
        keep: int | None = None,
        limit: int = 500,
        dry_run: bool = False,
    ) -> Pruned:
        """Delete up to ``limit`` settled calls, oldest first, with everything of theirs
        (actions, ToolData, events, files, triggers), in one transaction: those settled before
        ``settled_before`` (epoch seconds), and those beyond the newest ``keep`` settled calls.
        Never a call that is running, resumable or waiting. ``dry_run``: count, delete nothing.
        Call again while it removes ``limit`` calls."""
        ...

    # -- grants --------------------------------------------------------------------------------

    def add_grant(self, grant: GrantRecord) -> GrantRecord:
        """Store a standing grant; one of the same tenant, principal, tool, spec id, point and
        subject that is already there is kept (and returned) instead."""
        ...

    def find_grant(
        self, tenant: str, principal: str, tool: str, subject: str, *, spec_id: str, point: str
    ) -> GrantRecord | None: ...

    def grants(
        self,
        *,
        tenant: str | None = None,
        principal: str | None = None,
        tool: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[GrantRecord]:
        """The standing grants, oldest first (``after``: a grant id)."""
        ...

    def revoke_grant(
        self, grant_id: str, *, tenant: str | None = None, principal: str | None = None
    ) -> GrantRecord | None:
        """Remove a grant (of ``tenant`` and ``principal`` only, when given); the grant
        removed, or None."""
        ...

    # -- reads ---------------------------------------------------------------------------------

    def call(self, call_id: str) -> CallRecord | None: ...

    def calls(
        self,
        states: Iterable[CallState] | None = None,
        *,
        run_id: str | None = None,
        tenant: str | None = None,
        principal: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[CallRecord]:
        """Calls, oldest first (``after``: a call id)."""
        ...

    def action(self, action_id: str) -> ActionRecord | None: ...

    def actions(
        self,
        *,
        state: ActionState | None = "pending",
        run_id: str | None = None,
        name: str | None = None,
        call_id: str | None = None,
        tenant: str | None = None,
        principal: str | None = None,
        limit: int | None = None,
        after: str | None = None,
        suspended_before: str | None = None,
        suspended_since: str | None = None,
        thread_id: str | None = None,
        agent_id: str | None = None,
    ) -> list[ActionRecord]:
        """Actions, oldest first (``after``: an action id); ``suspended_before`` and
        ``suspended_since``: ISO 8601 times (UTC, as ``now()`` writes them) bounding when they
        were made; ``thread_id``, ``agent_id``: only those of calls of that thread, or run by
        that agent (their origin)."""
        ...

    def waiting(self) -> tuple[int, str | None]:
        """How many actions are pending, of every tenant, and when the oldest of them was made
        (ISO 8601; None when none is): what an operator's gauge reads, from the index of
        pending actions however many have been resolved."""
        ...

    def data(self, call_id: str, channel: str | None = None) -> list[DataRecord]: ...

    def file(self, file_id: str) -> FileRecord | None: ...

    def file_content(self, file_id: str) -> bytes | None: ...

    def trigger(self, trigger_id: str) -> TriggerRecord | None: ...

    def triggers(
        self, *, state: TriggerState | None = None, run_id: str | None = None
    ) -> list[TriggerRecord]: ...

    def events(
        self,
        run_id: str,
        after: int = 0,
        *,
        limit: int | None = None,
        tenant: str | None = None,
        principal: str | None = None,
    ) -> list[Event]:
        """The run's committed events after the sequence number ``after``, in commit order."""
        ...

    def head(self, run_id: str | None = None) -> int:
        """The sequence number of the last committed event (0: none). With ``run_id``, where a
        new subscription to that run starts: no event of the run committed later has a number
        up to it (on PostgreSQL, the run's events being committed are waited out; without a run
        a later commit there may still have a lower number)."""
        ...

    def mark(self) -> int:
        """How many notices of commits (by any process) this store has had: take it before a
        read of events, and ``changed(mark=...)`` returns at once if one came meanwhile."""
        ...

    async def changed(self, timeout_s: float, mark: int) -> None:
        """Return when events may have been committed since ``mark()`` said ``mark`` (at once if
        they may have been already), or after ``timeout_s``; it uses no CPU while it waits."""
        ...

    def close(self) -> None:
        """Close the store's connections, those other threads made and its renewers' too."""
        ...
