"""``SQLStore``: every rule of the store ring, written once, executed by each engine.

Each state change is one transaction of a few statements written here, in SQL both engines run:
a guarded write first (it must return a row, or the transaction ends with the guard's error and
nothing is written), then what follows from it, then its event, appended last. The rules that
need a decision in Python (which calls a sweep claims: ``core.store.claimable``; what resolving
an action does: ``core.actions``) are plain functions of the rows, made once.

A dialect keeps only what differs between engines: how a transaction runs (``_transaction``),
its clock in a statement (``_NOW``), how an event is appended and numbered, how a sweep finds
and locks its candidates, lease renewal, migrations, error classification, liveness and
notification. ``SQLiteStore`` runs a transaction as ``BEGIN IMMEDIATE`` on its thread's
connection; ``PostgresStore`` sends it in one pipelined round trip (its guards raise on the
server, so a failed one aborts what follows); ``MemoryStore`` is SQLite on a private in-memory
database: the same rules, whichever store a runtime has.

Whose a record is, is decided in the query: calls, actions and events carry their call's tenant
and principal (the id of the principal it was made for, "" for nobody), and every listing is a
page in a fixed order of keys that never change, after the record a cursor names.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol

from pydantic import JsonValue

from blade_runtime.core.store import (
    DEFAULT_LEASE_S,
    ActionAlreadyResolved,
    ActionRecord,
    ActionState,
    BadCursor,
    Begun,
    CallRecord,
    CallState,
    Claim,
    Claimed,
    DataRecord,
    DuplicateCall,
    EffectKind,
    EffectRecord,
    Event,
    FileRecord,
    GrantRecord,
    LeaseLost,
    Pruned,
    Resolution,
    Resolved,
    SaveStopped,
    SlotRecord,
    StoreError,
    StoreUnavailable,
    TriggerRecord,
    TriggerState,
    UnknownAction,
    claimable,
    clock,
    encodable,
    lapsed_before,
    now,
)
from blade_runtime.core.store import dump_json as dump
from blade_runtime.core.store import load_json as load

CALL_COLUMNS = (
    "call_id, run_id, name, spec_id, side_effect, execution, input, state, started_at, owner, "
    "entry, result, lease_until, tenant, context, kind, fence, principal, settled_at"
)
ACTION_COLUMNS = (
    "action_id, call_id, run_id, name, spec_id, point, payload, submit_schema, suspended_at, "
    "state, resume, resolved_at, reason, tenant, expires_at, principal, thread_id, agent_id"
)
DATA_COLUMNS = "call_id, channel, item_id, value, updated_at, seq"
EVENT_COLUMNS = "run_id, call_id, kind, payload, at, seq, tenant, principal"
FILE_COLUMNS = (
    "file_id, tenant, name, media_type, size, sha256, created_at, call_id, run_id, creator, "
    "thread_id"
)
TRIGGER_COLUMNS = (
    "trigger_id, call_id, run_id, name, tenant, input, created_at, context, thread_id, state, "
    "owner, claimed_until, finished_at, error"
)
EFFECT_COLUMNS = "effect_id, run_id, call_id, tenant, principal, kind, payload, at"
# payload: the effect's value (its other fields are columns)
GRANT_COLUMNS = "grant_id, tenant, principal, tool, subject, created_at, action_id, spec_id, point"
GRANT_KEY = "tenant, principal, tool, spec_id, point, subject"  # a grant's identity
_GRANT_IS = " AND ".join(f"{key} = :{key}" for key in GRANT_KEY.split(", "))
SLOT_COLUMNS = "slot_key, call_id, owner, ticket, capacity, held, lease_until, tenant, run_id, name"
# A slot row is one call's place in one key's queue, owned by a runtime (its lease, renewed by
# that runtime's polls and heartbeat). A call takes all its keys at once, never some: no call
# holds one key while it waits for another, so queues never wait on each other in a cycle. It
# takes them when, on each key, fewer than the capacity of other live rows are held or queued
# ahead of it (by ticket, the store's clock when it first queued; then call id and owner):
# FIFO, and rows held count whatever their ticket (PostgreSQL may commit a later ticket first).
_TAKE_SLOTS = (
    "UPDATE blade_slots SET held = 1 WHERE call_id = :call_id AND owner = :owner "
    "AND NOT EXISTS (SELECT 1 FROM blade_slots m WHERE m.call_id = :call_id "
    "AND m.owner = :owner AND (SELECT COUNT(*) FROM blade_slots o WHERE o.slot_key = m.slot_key "
    "AND NOT (o.call_id = m.call_id AND o.owner = m.owner) AND (o.held = 1 OR "
    "(o.ticket, o.call_id, o.owner) < (m.ticket, m.call_id, m.owner))) >= m.capacity) "
    "RETURNING slot_key"
)
_QUEUE_SLOT = (
    f"INSERT INTO blade_slots ({SLOT_COLUMNS}) VALUES (:key, :call_id, :owner, "
    "COALESCE((SELECT MIN(ticket) FROM blade_slots WHERE call_id = :call_id "
    "AND owner = :owner), {now}), :capacity, 0, {now} + :lease_s, :tenant, :run_id, :name) "
    "ON CONFLICT (slot_key, call_id, owner) DO UPDATE SET lease_until = excluded.lease_until"
)

# A runner's write stands only while its entry holds the call: the owner, the fencing token of
# its claim, still running. (``held`` asks more: a lease not yet expired by the store's clock;
# a write of an entry whose lease lapsed but that nobody took over is still its own.)
HELD = "call_id = :c_call_id AND owner = :c_owner AND fence = :c_fence AND state = 'running'"


def _values(columns: str) -> str:
    return ", ".join(f":{name.strip()}" for name in columns.split(","))


class Schemas:
    """Schemas repeat (every action of a suspend point stores the same one): each distinct text
    is parsed once, and each schema object (the runtime passes its own) is dumped once. Shared
    by the threads of a store: a lost race only parses or dumps a schema twice."""

    def __init__(self) -> None:
        self._parsed: dict[str, Any] = {}
        self._texts: dict[int, tuple[Any, str]] = {}
        self._lock = threading.Lock()

    def dump(self, schema: Any) -> str:
        found = self._texts.get(id(schema))
        if found is None or found[0] is not schema:
            found = (schema, dump(dict(schema)))
            with self._lock:
                self._texts[id(schema)] = found
        return found[1]

    def load(self, text: str) -> Any:
        parsed = self._parsed.get(text)
        if parsed is None:
            parsed = json.loads(text)
            with self._lock:
                self._parsed[text] = parsed
        return parsed


# -- records and their rows --------------------------------------------------------------------


def call_params(call: CallRecord) -> dict[str, Any]:
    return {
        "call_id": call.call_id,
        "run_id": call.run_id,
        "name": call.name,
        "spec_id": call.spec_id,
        "side_effect": call.side_effect,
        "execution": call.execution,
        "input": dump(dict(call.input)),
        "state": call.state,
        "started_at": call.started_at,
        "owner": call.owner,
        "entry": dump(call.entry),
        "result": dump(call.result),
        "lease_until": float(call.lease_until),
        "tenant": call.tenant,
        "context": dump(call.context),
        "kind": call.kind,
        "fence": int(call.fence),
        "principal": call.principal,
        "settled_at": call.settled_at,
    }


def call_record(row: Sequence[Any]) -> CallRecord:
    return CallRecord(
        call_id=row[0],
        run_id=row[1],
        name=row[2],
        spec_id=row[3],
        side_effect=row[4],
        execution=row[5],
        input=load(row[6]),
        state=row[7],
        started_at=row[8],
        owner=row[9],
        entry=load(row[10]),
        result=load(row[11]),
        lease_until=float(row[12]),
        tenant=row[13],
        context=load(row[14]),
        kind=row[15],
        fence=int(row[16]),
        principal=row[17],
        settled_at=None if row[18] is None else float(row[18]),
    )


def action_params(action: ActionRecord, schemas: Schemas) -> dict[str, Any]:
    return {
        "action_id": action.action_id,
        "call_id": action.call_id,
        "run_id": action.run_id,
        "name": action.name,
        "spec_id": action.spec_id,
        "point": action.point,
        "payload": dump(action.payload),
        "submit_schema": schemas.dump(action.submit_schema),
        "suspended_at": action.suspended_at,
        "state": action.state,
        "resume": dump(action.resume),
        "resolved_at": action.resolved_at,
        "reason": action.reason,
        "tenant": action.tenant,
        "expires_at": action.expires_at,
        "principal": action.principal,
        "thread_id": action.thread_id,
        "agent_id": action.agent_id,
    }


def action_record(row: Sequence[Any], schemas: Schemas) -> ActionRecord:
    return ActionRecord(
        action_id=row[0],
        call_id=row[1],
        run_id=row[2],
        name=row[3],
        spec_id=row[4],
        point=row[5],
        payload=load(row[6]),
        submit_schema=schemas.load(row[7]),
        suspended_at=row[8],
        state=row[9],
        resume=load(row[10]),
        resolved_at=row[11],
        reason=row[12],
        tenant=row[13],
        expires_at=row[14],
        principal=row[15],
        thread_id=row[16],
        agent_id=row[17],
    )


def event_record(row: Sequence[Any]) -> Event:
    return Event(row[0], row[1], row[2], load(row[3]), row[4], int(row[5]), row[6], row[7])


def data_record(row: Sequence[Any]) -> DataRecord:
    return DataRecord(row[0], row[1], row[2], load(row[3]), row[4], int(row[5]))


def grant_record(row: Sequence[Any]) -> GrantRecord:
    return GrantRecord(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8])


def grant_params(grant: GrantRecord) -> dict[str, Any]:
    return {name.strip(): getattr(grant, name.strip()) for name in GRANT_COLUMNS.split(",")}


def file_params(record: FileRecord) -> dict[str, Any]:
    return {name.strip(): getattr(record, name.strip()) for name in FILE_COLUMNS.split(",")}


def file_record(row: Sequence[Any]) -> FileRecord:
    return FileRecord(
        file_id=row[0],
        tenant=row[1],
        name=row[2],
        media_type=row[3],
        size=int(row[4]),
        sha256=row[5],
        created_at=row[6],
        call_id=row[7],
        run_id=row[8],
        creator=row[9],
        thread_id=row[10],
    )


def trigger_params(trigger: TriggerRecord) -> dict[str, Any]:
    found = {name.strip(): getattr(trigger, name.strip()) for name in TRIGGER_COLUMNS.split(",")}
    found["input"], found["context"] = dump(trigger.input), dump(trigger.context)
    found["claimed_until"] = float(trigger.claimed_until)
    return found


def effect_record(row: Sequence[Any]) -> EffectRecord:
    return EffectRecord(row[0], row[1], row[2], row[3], row[4], row[5], load(row[6]), row[7])


def trigger_record(row: Sequence[Any]) -> TriggerRecord:
    return TriggerRecord(
        trigger_id=row[0],
        call_id=row[1],
        run_id=row[2],
        name=row[3],
        tenant=row[4],
        input=load(row[5]),
        created_at=row[6],
        context=load(row[7]),
        thread_id=row[8],
        state=row[9],
        owner=row[10],
        claimed_until=float(row[11]),
        finished_at=row[12],
        error=row[13],
    )


def slot_record(row: Sequence[Any]) -> SlotRecord:
    key, call_id, owner, ticket, capacity, held, until, tenant, run_id, name = row
    return SlotRecord(
        key, call_id, owner, float(ticket), int(capacity), bool(held), float(until), tenant,
        run_id, name,
    )  # fmt: skip


def claim_params(claim: Claim) -> dict[str, Any]:
    return {"c_call_id": claim.call_id, "c_owner": claim.owner, "c_fence": int(claim.fence)}


# -- how a dialect runs a transaction -----------------------------------------------------------


class Rows(Protocol):
    """What one statement of a transaction returned: ready once the transaction has committed
    (SQLite's at once; PostgreSQL's pipelined ones when the round trip ends)."""

    def all(self) -> list[tuple[Any, ...]]: ...

    def one(self) -> tuple[Any, ...] | None: ...


class Tx(Protocol):
    """One transaction of a dialect: its statements in order, committed when the ``with`` block
    ends without an error, rolled back otherwise."""

    def run(self, sql: str, params: Mapping[str, Any] | None = None) -> Rows:
        """A statement (written with ``:name`` parameters and ``{now}`` for the clock)."""
        ...

    def require(
        self, sql: str, params: Mapping[str, Any], failure: Callable[[], StoreError]
    ) -> Rows:
        """A statement that must return a row (``RETURNING`` or a ``SELECT``); when it returns
        none the transaction ends, nothing of it is written, and ``failure()`` is raised (made
        after the rollback, so it may read the store)."""
        ...

    def append(self, event: Event, root_id: str) -> Rows:
        """Append ``event`` (its call's root: whose deletion takes it too); one row, its seq."""
        ...


@dataclass(frozen=True, slots=True)
class Candidates:
    """What a dialect found for a sweep: the calls (oldest first), each with the order its event
    takes (PostgreSQL: its run's lock key); the store's clock when the sweep began waiting for
    the store and when it had its locks; and what to do once it knows which it took."""

    calls: list[tuple[CallRecord, int]]
    began: float
    granted: float
    then: Callable[[set[str]], None] = lambda taken: None


class _Duplicate(StoreError):
    """A guard's failure that is not an error: the record is there already."""


# -- the store ----------------------------------------------------------------------------------


class SQLStore:
    """The store's rules, over a dialect's transactions and reads."""

    durable = True
    waits = True
    inline_first = False
    url: str

    _holds_nul: ClassVar[bool]  # whether its text may hold U+0000
    _SHARE: ClassVar[str] = ""  # a guard's row lock, held to the commit, where reads take none
    _SKIP_LOCKED: ClassVar[str] = ""  # a sweep's lock of the rows it takes, skipping others'
    _LAST_EVENT: ClassVar[str]  # the seq of the event this transaction appended last

    def __init__(self) -> None:
        self._schemas = Schemas()

    # -- what a dialect provides -----------------------------------------------------------------

    def _transaction(self) -> AbstractContextManager[Tx]:
        raise NotImplementedError

    def _fetch(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """The rows of one read."""
        raise NotImplementedError

    def _duplicate(self, error: BaseException) -> bool:
        """Whether ``error`` is a unique key's violation."""
        raise NotImplementedError

    def _candidates(
        self,
        tx: Tx,
        *,
        call_id: str | None,
        names: Collection[str] | Mapping[str, str] | None,
        dead: Collection[str],
        limit: int,
    ) -> Candidates:
        """A sweep's candidates, locked for this transaction: every call it may claim (and maybe
        more), oldest first."""
        raise NotImplementedError

    def _granted(self, tx: Tx, owner: str, until: Rows, event: Rows) -> None:
        """``owner`` now holds a running call whose lease and event are these (SQLite's
        bookkeeping of who holds what; nothing elsewhere)."""

    def _pruned(self) -> None:
        """A prune deleted rows (SQLite gives their pages back)."""

    def _lock_slots(self, tx: Tx, keys: Sequence[str]) -> None:
        """Serialize the transactions that queue on or take any of ``keys`` (sorted) until the
        commit (PostgreSQL; SQLite's transactions are serialized already)."""

    # -- ids ------------------------------------------------------------------------------------

    def _holdable(self, identifier: str) -> bool:
        """Whether the database could hold ``identifier``: a lookup of one it could not finds
        nothing, as a store that holds it would, instead of raising the driver's error."""
        if "\x00" in identifier and not self._holds_nul:
            return False
        return encodable(identifier)

    # -- a call's life ----------------------------------------------------------------------------

    def begin(self, call: CallRecord, event: Event, *, lease_s: float = DEFAULT_LEASE_S) -> Begun:
        running = call.state == "running"
        params = call_params(call) | {"lease_s": float(lease_s), "running": running}
        try:
            with self._transaction() as tx:
                until = tx.run(
                    f"INSERT INTO blade_calls ({CALL_COLUMNS}) VALUES ({_INSERT_CALL}) "
                    "RETURNING lease_until",
                    params,
                )
                seq = tx.append(event, call.call_id)
                if running:
                    self._granted(tx, call.owner, until, seq)
        except StoreError:
            raise
        except Exception as error:
            if self._duplicate(error):
                raise DuplicateCall(call.call_id) from None
            raise
        return Begun(_first(until), event.numbered(_first(seq)))

    def suspend(
        self, call: CallRecord, action: ActionRecord, event: Event, *, claim: Claim | None = None
    ) -> Event:
        try:
            with self._transaction() as tx:
                if claim is not None:
                    tx.require(
                        f"UPDATE blade_calls SET state = :state WHERE {HELD} RETURNING call_id",
                        {"state": call.state} | claim_params(claim),
                        lambda: LeaseLost(call.call_id, claim.owner),
                    )
                else:
                    tx.run(
                        f"INSERT INTO blade_calls ({CALL_COLUMNS}) VALUES ({_INSERT_CALL})",
                        call_params(call) | {"lease_s": 0.0, "running": False},
                    )
                tx.run(
                    f"INSERT INTO blade_actions ({ACTION_COLUMNS}) "
                    f"VALUES ({_values(ACTION_COLUMNS)})",
                    action_params(action, self._schemas),
                )
                seq = tx.append(event, call.call_id)
        except StoreError:
            raise
        except Exception as error:
            if self._duplicate(error):
                if claim is None:  # a new call: its id was taken (a client action's is its id)
                    raise DuplicateCall(call.call_id) from None
                raise StoreError(
                    f"call {call.call_id!r} or action {action.action_id!r} is already recorded"
                ) from None
            raise
        return event.numbered(_first(seq))

    def resolve(self, action_id: str, resolution: Resolution, event: Event) -> Resolved:
        owner = resolution.call_owner
        expiry = " AND expires_at <= :deadline_now" if resolution.only_if_expired else ""
        with self._transaction() as tx:
            action = tx.require(
                "UPDATE blade_actions SET state = :state, resume = :resume, "
                "resolved_at = :resolved_at, reason = :reason "
                f"WHERE action_id = :action_id AND state = 'pending'{expiry} "
                f"RETURNING {ACTION_COLUMNS}",
                {
                    "state": resolution.state,
                    "resume": dump(resolution.resume),
                    "resolved_at": resolution.resolved_at,
                    "reason": resolution.reason,
                    "action_id": action_id,
                    "deadline_now": clock(),  # an action's deadline is the runtime's clock
                },
                lambda: self._unresolvable(action_id),
            )
            call = tx.run(
                "UPDATE blade_calls SET state = :call_state, entry = :entry, result = :result, "
                "owner = COALESCE(:call_owner, owner), input = COALESCE(:call_input, input), "
                "kind = COALESCE(:call_kind, kind), "
                "side_effect = COALESCE(:call_side_effect, side_effect), "
                "lease_until = CASE WHEN :claims THEN {now} + :lease_s ELSE 0 END, "
                "fence = fence + (CASE WHEN :claims THEN 1 ELSE 0 END), "
                "settled_at = CASE WHEN :settles THEN {now} ELSE settled_at END "
                "WHERE call_id = (SELECT call_id FROM blade_actions WHERE action_id = :action_id) "
                "RETURNING input, context, fence, lease_until, kind, side_effect",
                {
                    "call_state": resolution.call_state,
                    "entry": dump(resolution.call_entry),
                    "result": dump(resolution.call_result),
                    "call_owner": owner,
                    "call_input": (
                        None if resolution.call_input is None else dump(resolution.call_input)
                    ),
                    "call_kind": resolution.call_kind,
                    "call_side_effect": resolution.call_side_effect,
                    "claims": owner is not None,
                    "lease_s": float(resolution.lease_s),
                    "settles": resolution.call_state == "settled",
                    "action_id": action_id,
                },
            )
            seq = tx.append(event, event.call_id)
            if owner is not None and resolution.call_state == "running":
                self._granted(tx, owner, _Column(call, 3), seq)
        resolved = action_record(_row(action), self._schemas)
        committed = event.numbered(_first(seq))
        row = call.one()
        if row is None:  # only an action was recorded
            return Resolved(resolved, {}, event=committed)
        return Resolved(
            resolved, load(row[0]), load(row[1]), int(row[2]), committed, row[4], row[5]
        )

    def _unresolvable(self, action_id: str) -> StoreError:
        """Why an action did not resolve: lost the race (how it went), or no such action."""
        found = self.action(action_id)
        if found is None:
            return UnknownAction(action_id)
        return ActionAlreadyResolved(found)

    def settle(self, claim: Claim, result: JsonValue, event: Event) -> Event:
        with self._transaction() as tx:
            tx.require(
                "UPDATE blade_calls SET state = 'settled', result = :result, "
                f"settled_at = {{now}} WHERE {HELD} RETURNING call_id",
                {"result": dump(result)} | claim_params(claim),
                lambda: LeaseLost(claim.call_id, claim.owner),
            )
            seq = tx.append(event, claim.call_id)
        return event.numbered(_first(seq))

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
        if call_id is not None and not self._holdable(call_id):
            return []
        taken: list[tuple[CallRecord, int, Rows]] = []
        with self._transaction() as tx:
            found = self._candidates(tx, call_id=call_id, names=names, dead=dead, limit=limit)
            lapsed = lapsed_before(found.began, found.granted, waited_s, lease_s)
            for call, order in found.calls:
                if len(taken) < limit and claimable(call, lapsed, dead, names, owner, running):
                    lease = tx.run(
                        "UPDATE blade_calls SET state = 'running', owner = :owner, "
                        "lease_until = {now} + :lease_s, fence = fence + 1 "
                        "WHERE call_id = :call_id RETURNING lease_until",
                        {"owner": owner, "lease_s": float(lease_s), "call_id": call.call_id},
                    )
                    taken.append((call, order, lease))
            # Events last, in their runs' lock order: two sweeps over the same runs take those
            # locks in one order (PostgreSQL), and every row lock is taken before them.
            events: list[tuple[Event, Rows]] = []
            for before, _, _ in sorted(taken, key=lambda t: (t[1], t[0].started_at)):
                payload: JsonValue = {"was": before.state, "previous_owner": before.owner}
                event = Event(
                    before.run_id,
                    before.call_id,
                    "claimed",
                    payload,
                    now(),
                    tenant=before.tenant,
                    principal=before.principal,
                )
                events.append((event, tx.append(event, before.call_id)))
            # The rows the sweep examined first, then the claimer's grant: its own row may have
            # been among them (due, holding nothing), and rewritten last it would drop the
            # calls just granted.
            found.then({call.call_id for call, _, _ in taken})
            if taken:  # the first event appended has the smallest number
                self._granted(tx, owner, taken[0][2], events[0][1])
        numbered = {event.call_id: event.numbered(_first(seq)) for event, seq in events}
        return [
            Claimed(
                replace(
                    before,
                    state="running",
                    owner=owner,
                    lease_until=_first(lease),
                    fence=before.fence + 1,
                ),
                before.state,
                before.owner,
                numbered[before.call_id],
            )
            for before, _, lease in taken
        ]

    def held(self, claim: Claim) -> bool:
        if not (self._holdable(claim.call_id) and self._holdable(claim.owner)):
            return False
        return bool(
            self._fetch(
                f"SELECT 1 FROM blade_calls WHERE {HELD} AND lease_until >= {self._NOW}",
                claim_params(claim),
            )
        )

    def _fenced(self, tx: Tx, claim: Claim | None) -> None:
        """A runner's write: its entry must still hold the call (the row locked to the commit
        where reads take no lock, so no claim slips in between)."""
        if claim is not None:
            tx.require(
                f"SELECT call_id FROM blade_calls WHERE {HELD}{self._SHARE}",
                claim_params(claim),
                lambda: LeaseLost(claim.call_id, claim.owner),
            )

    def write_data(
        self, record: DataRecord, event: Event | None, *, claim: Claim | None = None
    ) -> Event | None:
        root = record.call_id if claim is None else claim.call_id
        with self._transaction() as tx:
            self._fenced(tx, claim)
            # Same item id: the value and time change, the position (seq) stays.
            tx.run(
                "INSERT INTO blade_data (call_id, channel, item_id, value, updated_at, root_id) "
                "VALUES (:call_id, :channel, :item_id, :value, :updated_at, :root_id) "
                "ON CONFLICT (call_id, channel, item_id) DO UPDATE SET "
                "value = excluded.value, updated_at = excluded.updated_at",
                {
                    "call_id": record.call_id,
                    "channel": record.channel,
                    "item_id": record.item_id,
                    "value": dump(record.value),
                    "updated_at": record.updated_at,
                    "root_id": root,
                },
            )
            seq = None if event is None else tx.append(event, root)
        return None if event is None or seq is None else event.numbered(_first(seq))

    def save_file(
        self,
        record: FileRecord,
        content: bytes,
        *,
        claim: Claim | None = None,
        keep: Callable[[], bool] | None = None,
    ) -> None:
        with self._transaction() as tx:
            self._fenced(tx, claim)
            tx.run(
                f"INSERT INTO blade_files ({FILE_COLUMNS}, root_id, content) "
                f"VALUES ({_values(FILE_COLUMNS)}, :root_id, :content)",
                file_params(record)
                | {
                    "content": content,
                    "root_id": record.call_id if claim is None else claim.call_id,
                },
            )
            if keep is not None and not keep():  # rolled back: nothing of it is stored
                raise SaveStopped(f"file {record.file_id} was not kept")

    def delete_file(self, file_id: str) -> bool:
        if not self._holdable(file_id):
            return False
        with self._transaction() as tx:
            gone = tx.run(
                "DELETE FROM blade_files WHERE file_id = :id RETURNING 1", {"id": file_id}
            )
        return bool(gone.all())

    def add_trigger(
        self, trigger: TriggerRecord, event: Event, *, claim: Claim | None = None
    ) -> Event | None:
        root = trigger.call_id if claim is None else claim.call_id
        try:
            with self._transaction() as tx:
                self._fenced(tx, claim)
                tx.require(
                    f"INSERT INTO blade_triggers ({TRIGGER_COLUMNS}, root_id) "
                    f"VALUES ({_values(TRIGGER_COLUMNS)}, :root_id) "
                    "ON CONFLICT (trigger_id) DO NOTHING RETURNING trigger_id",
                    trigger_params(trigger) | {"root_id": root},
                    lambda: _Duplicate(trigger.trigger_id),
                )
                seq = tx.append(event, root)
        except _Duplicate:
            return None  # recorded already: a replayed entry asks again
        return event.numbered(_first(seq))

    def add_effect(
        self,
        effect: EffectRecord,
        event: Event,
        *,
        claim: Claim | None = None,
        grant: GrantRecord | None = None,
        revoke: GrantRecord | None = None,
    ) -> Event | None:
        root = effect.call_id if claim is None else claim.call_id
        try:
            with self._transaction() as tx:
                self._fenced(tx, claim)
                seq = tx.append(event, root)
                # numbered as its event: a run's context folds its patches in the order a
                # subscriber reads them, whichever transaction drew its number first
                tx.require(
                    f"INSERT INTO blade_effects (seq, {EFFECT_COLUMNS}, root_id) "
                    f"VALUES ({self._LAST_EVENT}, {_values(EFFECT_COLUMNS)}, :root_id) "
                    "ON CONFLICT (effect_id) DO NOTHING RETURNING effect_id",
                    {
                        "effect_id": effect.effect_id,
                        "run_id": effect.run_id,
                        "call_id": effect.call_id,
                        "tenant": effect.tenant,
                        "principal": effect.principal,
                        "kind": effect.kind,
                        "payload": dump(effect.value),
                        "at": effect.at,
                        "root_id": root,
                    },
                    lambda: _Duplicate(effect.effect_id),
                )
                if grant is not None:
                    tx.run(
                        f"INSERT INTO blade_grants ({GRANT_COLUMNS}) "
                        f"VALUES ({_values(GRANT_COLUMNS)}) ON CONFLICT ({GRANT_KEY}) DO NOTHING",
                        grant_params(grant),
                    )
                if revoke is not None:
                    tx.run(f"DELETE FROM blade_grants WHERE {_GRANT_IS}", grant_params(revoke))
        except _Duplicate:
            return None  # recorded already: a replayed entry emits it again
        return event.numbered(_first(seq))

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
        if not all(self._holdable(text) for text in (run_id, tenant, principal, call_id or "")):
            return []
        where = _Where(
            {
                "run_id": run_id,
                "tenant": tenant,
                "principal": principal,
                "kind": kind,
                "call_id": call_id,
            }
        )
        rows = self._fetch(
            f"SELECT {EFFECT_COLUMNS} FROM blade_effects{where} ORDER BY seq{_limit(limit)}",
            where.params | {"limit": limit},
        )
        return [effect_record(row) for row in rows]

    # -- sweeps -----------------------------------------------------------------------------------

    # -- concurrency slots and resource locks (core.slots) -------------------------------------

    def announce(self, event: Event, *, claim: Claim) -> Event:
        with self._transaction() as tx:
            self._fenced(tx, claim)
            seq = tx.append(event, claim.call_id)
        return event.numbered(_first(seq))

    def acquire_slots(
        self, entry: SlotRecord, keys: Sequence[tuple[str, int]], lease_s: float
    ) -> bool:
        mine = {"call_id": entry.call_id, "owner": entry.owner}
        marks = {f"k{n}": key for n, (key, _) in enumerate(keys)}
        since = clock()  # SQLite's clock before it waits for the write lock
        with self._transaction() as tx:
            self._lock_slots(tx, sorted(marks.values()))
            # A row lapsed only if its lease ran out before this transaction began waiting: a
            # wait for the lock may have held up its owner's renewal too.
            tx.run(
                f"DELETE FROM blade_slots WHERE slot_key IN ({_values(', '.join(marks))}) "
                f"AND lease_until < {self._BEFORE_WAIT}",
                marks | {"since": since},
            )
            for key, capacity in keys:
                tx.run(
                    _QUEUE_SLOT,
                    mine
                    | {
                        "key": key,
                        "capacity": capacity,
                        "lease_s": float(lease_s),
                        "tenant": entry.tenant,
                        "run_id": entry.run_id,
                        "name": entry.name,
                    },
                )
            taken = tx.run(_TAKE_SLOTS, mine)
        return len(taken.all()) == len(keys)

    def release_slots(self, call_id: str, owner: str) -> int:
        since = clock()
        with self._transaction() as tx:
            # and the rows of dead workers, on keys nobody queues on again (a small table)
            gone = tx.run(
                "DELETE FROM blade_slots WHERE (call_id = :call_id AND owner = :owner) "
                f"OR lease_until < {self._BEFORE_WAIT} RETURNING call_id, owner",
                {"call_id": call_id, "owner": owner, "since": since},
            )
        return sum(row == (call_id, owner) for row in gone.all())

    def renew_slots(self, owner: str, call_ids: Collection[str], lease_s: float) -> set[str]:
        marks = {f"i{n}": call_id for n, call_id in enumerate(call_ids)}
        if not marks:
            return set()
        with self._transaction() as tx:
            kept = tx.run(
                "UPDATE blade_slots SET lease_until = {now} + :lease_s WHERE owner = :owner "
                f"AND call_id IN ({_values(', '.join(marks))}) RETURNING call_id",
                marks | {"owner": owner, "lease_s": float(lease_s)},
            )
        return {row[0] for row in kept.all()}

    def slots(self, *, tenant: str | None = None, call_id: str | None = None) -> list[SlotRecord]:
        if call_id is not None and not self._holdable(call_id):
            return []
        whose = "" if tenant is None else " AND tenant = :tenant"
        whose += "" if call_id is None else " AND call_id = :call_id"
        rows = self._fetch(
            f"SELECT {SLOT_COLUMNS} FROM blade_slots WHERE lease_until >= {self._NOW}{whose} "
            "ORDER BY slot_key, held DESC, ticket, call_id, owner",
            {"tenant": tenant, "call_id": call_id},
        )
        return [slot_record(row) for row in rows]

    def expired(self, limit: int = 100) -> list[ActionRecord]:
        # Deadlines are the runtime's clock (it computes expires_at), on every store.
        rows = self._fetch(
            f"SELECT {ACTION_COLUMNS} FROM blade_actions WHERE state = 'pending' "
            "AND expires_at IS NOT NULL AND expires_at <= :at ORDER BY expires_at LIMIT :limit",
            {"at": clock(), "limit": limit},
        )
        return [action_record(row, self._schemas) for row in rows]

    def claim_triggers(
        self, owner: str, lease_s: float, *, limit: int = 100
    ) -> list[TriggerRecord]:
        # Concurrent claims skip the rows another holds (PostgreSQL), or wait for the write
        # lock and then see them taken (SQLite).
        with self._transaction() as tx:
            rows = tx.run(
                "UPDATE blade_triggers SET state = 'claimed', owner = :owner, "
                "claimed_until = {now} + :lease_s WHERE seq IN (SELECT seq FROM blade_triggers "
                "WHERE state IN ('pending', 'claimed') AND (state = 'pending' OR "
                f"claimed_until < {{now}}) ORDER BY seq LIMIT :limit{self._SKIP_LOCKED}) "
                f"RETURNING seq, {TRIGGER_COLUMNS}",
                {"owner": owner, "lease_s": float(lease_s), "limit": limit},
            )
        return [trigger_record(row[1:]) for row in sorted(rows.all())]

    def finish_trigger(self, trigger_id: str, owner: str, *, error: str | None = None) -> bool:
        with self._transaction() as tx:
            done = tx.run(
                "UPDATE blade_triggers SET state = :state, finished_at = :at, error = :error "
                "WHERE trigger_id = :trigger_id AND owner = :owner AND state = 'claimed' "
                "RETURNING 1",
                {
                    "state": "delivered" if error is None else "failed",
                    "at": now(),
                    "error": error,
                    "trigger_id": trigger_id,
                    "owner": owner,
                },
            )
        return bool(done.all())

    def prune(
        self,
        *,
        settled_before: float | None = None,
        keep: int | None = None,
        limit: int = 500,
        dry_run: bool = False,
    ) -> Pruned:
        if settled_before is None and keep is None:
            return Pruned()
        with self._transaction() as tx:
            ids = [row[0] for row in self._prunable(tx, settled_before, keep, limit)]
            if not ids:
                return Pruned()
            marks = ", ".join(f":i{n}" for n in range(len(ids)))
            params = {f"i{n}": identifier for n, identifier in enumerate(ids)}
            counted = tx.run(
                "SELECT "
                f"(SELECT count(*) FROM blade_actions WHERE call_id IN ({marks})), "
                f"(SELECT count(*) FROM blade_data WHERE root_id IN ({marks})), "
                f"(SELECT count(*) FROM blade_events WHERE root_id IN ({marks})), "
                f"(SELECT count(*) FROM blade_files WHERE root_id IN ({marks})), "
                f"(SELECT count(*) FROM blade_triggers WHERE root_id IN ({marks})), "
                f"(SELECT COALESCE(sum(length(input) + COALESCE(length(result), 0)), 0) "
                f"FROM blade_calls WHERE call_id IN ({marks})) + "
                f"(SELECT COALESCE(sum(length(payload)), 0) FROM blade_events "
                f"WHERE root_id IN ({marks})) + "
                f"(SELECT COALESCE(sum(size), 0) FROM blade_files WHERE root_id IN ({marks})) + "
                f"(SELECT COALESCE(sum(length(payload)), 0) FROM blade_effects "
                f"WHERE root_id IN ({marks})), "
                f"(SELECT count(*) FROM blade_effects WHERE root_id IN ({marks}))",
                params,
            )
            if not dry_run:
                tx.run(f"DELETE FROM blade_actions WHERE call_id IN ({marks})", params)
                for table in (
                    "blade_data",
                    "blade_events",
                    "blade_files",
                    "blade_triggers",
                    "blade_effects",
                ):
                    tx.run(f"DELETE FROM {table} WHERE root_id IN ({marks})", params)
                tx.run(f"DELETE FROM blade_calls WHERE call_id IN ({marks})", params)
        row = _row(counted)
        pruned = Pruned(len(ids), *(int(value or 0) for value in row))
        if not dry_run:
            self._pruned()
        return pruned

    def _prunable(
        self, tx: Tx, settled_before: float | None, keep: int | None, limit: int
    ) -> list[tuple[Any, ...]]:
        """The oldest settled calls the policy lets go, at most ``limit``: settled before
        ``settled_before``, or older than the newest ``keep`` (by settling time, then id)."""
        chosen: list[str] = []
        params: dict[str, Any] = {"limit": limit}
        if settled_before is not None:
            chosen.append("settled_at < :before")
            params["before"] = settled_before
        if keep is not None:
            edge = tx.run(
                "SELECT settled_at, call_id FROM blade_calls WHERE settled_at IS NOT NULL "
                "ORDER BY settled_at DESC, call_id DESC LIMIT 1 OFFSET :keep",
                {"keep": keep},
            ).one()
            if edge is not None:
                chosen.append("(settled_at, call_id) <= (:edge_at, :edge_id)")
                params |= {"edge_at": edge[0], "edge_id": edge[1]}
        if not chosen:
            return []
        return tx.run(
            "SELECT call_id FROM blade_calls WHERE settled_at IS NOT NULL AND state = 'settled' "
            f"AND ({' OR '.join(chosen)}) ORDER BY settled_at, call_id LIMIT :limit",
            params,
        ).all()

    # -- grants -----------------------------------------------------------------------------------

    def add_grant(self, grant: GrantRecord) -> GrantRecord:
        with self._transaction() as tx:
            tx.run(
                f"INSERT INTO blade_grants ({GRANT_COLUMNS}) VALUES ({_values(GRANT_COLUMNS)}) "
                f"ON CONFLICT ({GRANT_KEY}) DO NOTHING",
                grant_params(grant),
            )
            kept = tx.run(
                f"SELECT {GRANT_COLUMNS} FROM blade_grants WHERE {_GRANT_IS}", grant_params(grant)
            )
        return grant_record(_row(kept))

    def find_grant(
        self, tenant: str, principal: str, tool: str, subject: str, *, spec_id: str, point: str
    ) -> GrantRecord | None:
        key = {
            "tenant": tenant,
            "principal": principal,
            "tool": tool,
            "spec_id": spec_id,
            "point": point,
            "subject": subject,
        }
        if not all(self._holdable(text) for text in key.values()):
            return None
        rows = self._fetch(f"SELECT {GRANT_COLUMNS} FROM blade_grants WHERE {_GRANT_IS}", key)
        return grant_record(rows[0]) if rows else None

    def grants(
        self,
        *,
        tenant: str | None = None,
        principal: str | None = None,
        tool: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[GrantRecord]:
        where = _Where({"tenant": tenant, "principal": principal, "tool": tool})
        if after is not None:
            where.after(self, "blade_grants", "grant_id", ("created_at", "grant_id"), after)
        rows = self._fetch(
            f"SELECT {GRANT_COLUMNS} FROM blade_grants{where} "
            f"ORDER BY created_at, grant_id{_limit(limit)}",
            where.params | {"limit": limit},
        )
        return [grant_record(row) for row in rows]

    def revoke_grant(
        self, grant_id: str, *, tenant: str | None = None, principal: str | None = None
    ) -> GrantRecord | None:
        if not self._holdable(grant_id):
            return None
        where = _Where({"grant_id": grant_id, "tenant": tenant, "principal": principal})
        with self._transaction() as tx:
            gone = tx.run(
                f"DELETE FROM blade_grants{where} RETURNING {GRANT_COLUMNS}", where.params
            )
        row = gone.one()
        return None if row is None else grant_record(row)

    # -- reads ------------------------------------------------------------------------------------

    def call(self, call_id: str) -> CallRecord | None:
        if not self._holdable(call_id):
            return None
        rows = self._fetch(
            f"SELECT {CALL_COLUMNS} FROM blade_calls WHERE call_id = :id", {"id": call_id}
        )
        return call_record(rows[0]) if rows else None

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
        wanted = None if states is None else list(states)
        if wanted == [] or (run_id is not None and not self._holdable(run_id)):
            return []
        where = _Where({"state": wanted, "run_id": run_id, "tenant": tenant}, principal)
        if after is not None:
            where.after(self, "blade_calls", "call_id", ("started_at", "call_id"), after)
        rows = self._fetch(
            f"SELECT {CALL_COLUMNS} FROM blade_calls{where} "
            f"ORDER BY started_at, call_id{_limit(limit)}",
            where.params | {"limit": limit},
        )
        return [call_record(row) for row in rows]

    def action(self, action_id: str) -> ActionRecord | None:
        if not self._holdable(action_id):
            return None
        rows = self._fetch(
            f"SELECT {ACTION_COLUMNS} FROM blade_actions WHERE action_id = :id", {"id": action_id}
        )
        return action_record(rows[0], self._schemas) if rows else None

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
        given = {
            "state": state,
            "run_id": run_id,
            "name": name,
            "call_id": call_id,
            "tenant": tenant,
            "thread_id": thread_id,  # no index: narrows what the tenant's index found
            "agent_id": agent_id,
        }
        if not all(self._holdable(value) for value in given.values() if value is not None):
            return []
        where = _Where(given, principal)
        if suspended_before is not None:
            where.clauses.append("suspended_at < :suspended_before")
            where.params["suspended_before"] = suspended_before
        if suspended_since is not None:
            where.clauses.append("suspended_at >= :suspended_since")
            where.params["suspended_since"] = suspended_since
        if after is not None:
            where.after(self, "blade_actions", "action_id", ("suspended_at", "action_id"), after)
        rows = self._fetch(
            f"SELECT {ACTION_COLUMNS} FROM blade_actions{where} "
            f"ORDER BY suspended_at, action_id{_limit(limit)}",
            where.params | {"limit": limit},
        )
        return [action_record(row, self._schemas) for row in rows]

    def waiting(self) -> tuple[int, str | None]:
        [(count, oldest)] = self._fetch(
            "SELECT COUNT(*), MIN(suspended_at) FROM blade_actions WHERE state = 'pending'"
        )
        return int(count), None if oldest is None else str(oldest)

    def data(self, call_id: str, channel: str | None = None) -> list[DataRecord]:
        if not self._holdable(call_id):
            return []
        where = _Where({"call_id": call_id, "channel": channel})
        rows = self._fetch(
            f"SELECT {DATA_COLUMNS} FROM blade_data{where} ORDER BY seq", where.params
        )
        return [data_record(row) for row in rows]

    def file(self, file_id: str) -> FileRecord | None:
        if not self._holdable(file_id):
            return None
        rows = self._fetch(
            f"SELECT {FILE_COLUMNS} FROM blade_files WHERE file_id = :id", {"id": file_id}
        )
        return file_record(rows[0]) if rows else None

    def file_content(self, file_id: str) -> bytes | None:
        if not self._holdable(file_id):
            return None
        rows = self._fetch("SELECT content FROM blade_files WHERE file_id = :id", {"id": file_id})
        return bytes(rows[0][0]) if rows else None

    def trigger(self, trigger_id: str) -> TriggerRecord | None:
        if not self._holdable(trigger_id):
            return None
        rows = self._fetch(
            f"SELECT {TRIGGER_COLUMNS} FROM blade_triggers WHERE trigger_id = :id",
            {"id": trigger_id},
        )
        return trigger_record(rows[0]) if rows else None

    def triggers(
        self, *, state: TriggerState | None = None, run_id: str | None = None
    ) -> list[TriggerRecord]:
        where = _Where({"state": state, "run_id": run_id})
        rows = self._fetch(
            f"SELECT {TRIGGER_COLUMNS} FROM blade_triggers{where} ORDER BY seq", where.params
        )
        return [trigger_record(row) for row in rows]

    def events(
        self,
        run_id: str,
        after: int = 0,
        *,
        limit: int | None = None,
        tenant: str | None = None,
        principal: str | None = None,
    ) -> list[Event]:
        if not self._holdable(run_id):
            return []
        where = _Where({"run_id": run_id, "tenant": tenant}, principal)
        rows = self._events(where, int(after), limit)
        return [event_record(row) for row in rows]

    def _events(self, where: _Where, after: int, limit: int | None) -> list[tuple[Any, ...]]:
        """A run's events after ``after`` (a dialect may read them under its run's lock)."""
        return self._fetch(
            f"SELECT {EVENT_COLUMNS} FROM blade_events{where} AND seq > :after "
            f"ORDER BY seq{_limit(limit)}",
            where.params | {"after": after, "limit": limit},
        )

    # -- migrations -------------------------------------------------------------------------------

    def _migrate_from(
        self, version: int, migrations: Sequence[Sequence[str]], run: Callable[[str], object]
    ) -> None:
        """Run the migrations that take ``version`` to the newest, in order, each statement by
        ``run`` (the caller holds the transaction and records the new version)."""
        self._refuse_newer(version, len(migrations))
        for step in range(version, len(migrations)):
            for statement in migrations[step]:
                run(statement)

    def _refuse_newer(self, version: int, known: int) -> None:
        if version > known:
            raise StoreUnavailable(
                f"{self.url}: store schema version {version} is newer than this "
                f"blade-runtime knows ({known}); upgrade blade-runtime"
            )

    def _not_made(self, why: str | None = None) -> StoreUnavailable:
        """The error for a database no runtime made (``open_store(create=False)``)."""
        return StoreUnavailable(
            f"{self.url}: not a blade-runtime store ("
            + (
                why
                or "it has none of its tables; a runtime makes them when it first opens the store"
            )
            + ")"
        )

    _NOW: ClassVar[str]  # the store's clock in a statement, as epoch seconds
    _BEFORE_WAIT: ClassVar[str]  # its clock when the transaction began, before any lock wait


# A new call's row: its lease runs from the store's clock at the commit when it is running.
_INSERT_CALL = _values(CALL_COLUMNS).replace(
    ":lease_until", "CASE WHEN :running THEN {now} + :lease_s ELSE :lease_until END"
)


class _Where:
    """A listing's filters: ``column = :column`` for each one given (a list: ``IN``), and the
    principal's records (made for it, or for nobody); only those given, so that indexes serve."""

    def __init__(self, given: Mapping[str, Any], principal: str | None = None) -> None:
        self.clauses: list[str] = []
        self.params: dict[str, Any] = {}
        for column, value in given.items():
            if value is None:
                continue
            if isinstance(value, list | tuple):
                marks = [f":{column}{n}" for n in range(len(value))]
                self.clauses.append(f"{column} IN ({', '.join(marks)})")
                self.params.update(zip((m[1:] for m in marks), value, strict=True))
            else:
                self.clauses.append(f"{column} = :{column}")
                self.params[column] = value
        if principal is not None:
            self.clauses.append("principal IN ('', :principal)")
            self.params["principal"] = principal

    def after(
        self, store: SQLStore, table: str, id_column: str, keys: tuple[str, str], cursor: str
    ) -> None:
        """Only records after the one ``cursor`` names, which must pass the same tenant and
        principal filters (another principal's record is no place to start from)."""
        visible = [c for c in self.clauses if c.startswith(("tenant ", "principal "))]
        found = (
            store._fetch(
                f"SELECT {', '.join(keys)} FROM {table} WHERE {id_column} = :cursor"
                + "".join(f" AND {c}" for c in visible),
                {"cursor": cursor} | {k: v for k, v in self.params.items() if k in _VISIBILITY},
            )
            if store._holdable(cursor)
            else []
        )
        if not found:
            raise BadCursor(f"no page starts after {cursor!r} here; list from the first page")
        self.clauses.append(f"({', '.join(keys)}) > (:after_0, :after_1)")
        self.params |= {"after_0": found[0][0], "after_1": found[0][1]}

    def __str__(self) -> str:
        return f" WHERE {' AND '.join(self.clauses)}" if self.clauses else ""


_VISIBILITY = ("tenant", "principal")


def names_filter(names: Collection[str] | Mapping[str, str] | None) -> tuple[str, dict[str, Any]]:
    """A sweep's ``AND ...`` for the registrations it can run: their names, or given as a
    mapping, each name with its spec id (no clause for None; nothing at all for none)."""
    if names is None:
        return "", {}
    if isinstance(names, Mapping):
        pairs = [f"(name = :n{i} AND spec_id = :s{i})" for i in range(len(names))]
        values = {f"n{i}": name for i, name in enumerate(names)}
        values |= {f"s{i}": spec for i, spec in enumerate(names.values())}
        return f" AND ({' OR '.join(pairs) or '1 = 0'})", values
    listed = {f"n{i}": name for i, name in enumerate(names)}
    if not listed:
        return " AND 1 = 0", {}
    return f" AND name IN ({', '.join(':' + key for key in listed)})", listed


def _limit(limit: int | None) -> str:
    return "" if limit is None else " LIMIT :limit"


def _row(rows: Rows) -> tuple[Any, ...]:
    row = rows.one()
    assert row is not None  # a guarded statement returned its row
    return row


def _first(rows: Rows) -> Any:
    return _row(rows)[0]


class _Column:
    """One column of another statement's row, read as that statement's rows are."""

    def __init__(self, rows: Rows, index: int) -> None:
        self._rows, self._index = rows, index

    def all(self) -> list[tuple[Any, ...]]:
        return [(row[self._index],) for row in self._rows.all()]

    def one(self) -> tuple[Any, ...] | None:
        row = self._rows.one()
        return None if row is None else (row[self._index],)


_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def pyformat(sql: str) -> str:
    """``:name`` parameters as ``%(name)s`` (psycopg's named style); ``::type`` casts kept."""
    return _PARAM.sub(r"%(\1)s", sql.replace("%", "%%"))


def rows_of(cursor_rows: Iterator[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return list(cursor_rows)
