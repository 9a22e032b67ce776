"""``SQLStore``: what SQLiteStore and PostgresStore share.

The records' columns and their row forms, the schema cache, the guard for ids no database could
hold, the listings of calls, actions, data and expired actions (one filter builder), and the
migration runner's rules. Each dialect keeps its statements for the state changes, its
liveness (``owners``, ``alive``, ``attach``, ``detach``) and its notification (``changed``), and
says how a read runs (``_fetch``) and how it names parameters (``_mark``) and tables.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

from blade_runtime.core.store import (
    ActionRecord,
    ActionState,
    CallRecord,
    CallState,
    DataRecord,
    FileRecord,
    GrantRecord,
    StoreUnavailable,
    TriggerRecord,
    TriggerState,
    clock,
    encodable,
)
from blade_runtime.core.store import dump_json as dump
from blade_runtime.core.store import load_json as load

CALL_COLUMNS = (
    "call_id, run_id, name, spec_id, side_effect, execution, input, state, started_at, owner, "
    "entry, result, lease_until, tenant, context, kind, fence"
)
ACTION_COLUMNS = (
    "action_id, call_id, run_id, name, spec_id, point, payload, submit_schema, suspended_at, "
    "state, resume, resolved_at, reason, tenant, expires_at"
)
DATA_COLUMNS = "call_id, channel, item_id, value, updated_at, seq"
FILE_COLUMNS = (
    "file_id, tenant, name, media_type, size, sha256, created_at, call_id, run_id, creator, "
    "thread_id"
)
TRIGGER_COLUMNS = (
    "trigger_id, call_id, run_id, name, tenant, input, created_at, context, thread_id, state, "
    "owner, claimed_until, finished_at, error"
)
GRANT_COLUMNS = "grant_id, tenant, principal, tool, subject, created_at, action_id, spec_id, point"
GRANT_KEY = "tenant, principal, tool, spec_id, point, subject"  # a grant's identity


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


def call_values(call: CallRecord, lease_until: float) -> tuple[Any, ...]:
    """``call`` in CALL_COLUMNS' order, as stored (its lease: ``lease_until``)."""
    return (
        call.call_id,
        call.run_id,
        call.name,
        call.spec_id,
        call.side_effect,
        call.execution,
        dump(dict(call.input)),
        call.state,
        call.started_at,
        call.owner,
        dump(call.entry),
        dump(call.result),
        float(lease_until),
        call.tenant,
        dump(call.context),
        call.kind,
        int(call.fence),
    )


def action_values(action: ActionRecord, schemas: Schemas) -> tuple[Any, ...]:
    """``action`` in ACTION_COLUMNS' order, as stored."""
    return (
        action.action_id,
        action.call_id,
        action.run_id,
        action.name,
        action.spec_id,
        action.point,
        dump(action.payload),
        schemas.dump(action.submit_schema),
        action.suspended_at,
        action.state,
        dump(action.resume),
        action.resolved_at,
        action.reason,
        action.tenant,
        action.expires_at,
    )


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
    )


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
    )


def grant_record(row: Sequence[Any]) -> GrantRecord:
    return GrantRecord(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8])


def grant_values(grant: GrantRecord) -> tuple[Any, ...]:
    """``grant`` in GRANT_COLUMNS' order."""
    return (
        grant.grant_id,
        grant.tenant,
        grant.principal,
        grant.tool,
        grant.subject,
        grant.created_at,
        grant.action_id,
        grant.spec_id,
        grant.point,
    )


def grant_key(grant: GrantRecord) -> tuple[str, ...]:
    """``grant``'s identity in GRANT_KEY's order."""
    return (grant.tenant, grant.principal, grant.tool, grant.spec_id, grant.point, grant.subject)


def data_record(row: Sequence[Any]) -> DataRecord:
    return DataRecord(row[0], row[1], row[2], load(row[3]), row[4], int(row[5]))


def file_values(record: FileRecord) -> tuple[Any, ...]:
    """``record`` in FILE_COLUMNS' order."""
    return (
        record.file_id,
        record.tenant,
        record.name,
        record.media_type,
        record.size,
        record.sha256,
        record.created_at,
        record.call_id,
        record.run_id,
        record.creator,
        record.thread_id,
    )


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


def trigger_values(trigger: TriggerRecord) -> tuple[Any, ...]:
    """``trigger`` in TRIGGER_COLUMNS' order, as stored."""
    return (
        trigger.trigger_id,
        trigger.call_id,
        trigger.run_id,
        trigger.name,
        trigger.tenant,
        dump(trigger.input),
        trigger.created_at,
        dump(trigger.context),
        trigger.thread_id,
        trigger.state,
        trigger.owner,
        float(trigger.claimed_until),
        trigger.finished_at,
        trigger.error,
    )


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


class SQLStore:
    """The reads and rules both SQL stores share; a dialect subclasses it."""

    durable = True
    waits = True
    inline_first = False
    url: str

    _mark: ClassVar[str]  # the parameter marker: "?" or "%s"
    _holds_nul: ClassVar[bool]  # whether its text may hold U+0000
    _calls: ClassVar[str]  # the tables' names
    _actions: ClassVar[str]
    _data: ClassVar[str]
    _files: ClassVar[str]
    _triggers: ClassVar[str]
    _grants: ClassVar[str]

    def __init__(self) -> None:
        self._schemas = Schemas()

    def _fetch(self, query: str, values: Sequence[Any]) -> list[tuple[Any, ...]]:
        """The rows of one read (a dialect runs it on its connection)."""
        raise NotImplementedError

    # -- ids ------------------------------------------------------------------------------------

    def _holdable(self, identifier: str) -> bool:
        """Whether the database could hold ``identifier``: a lookup of one it could not finds
        nothing, as MemoryStore's does, instead of raising the driver's error."""
        if "\x00" in identifier and not self._holds_nul:
            return False
        return encodable(identifier)

    # -- filters --------------------------------------------------------------------------------

    def _where(self, given: dict[str, Any]) -> tuple[list[str], list[Any]]:
        """``column = marker`` for each filter given (not None); a list or tuple is ``IN``.
        Only the filters given: "marker IS NULL OR column = marker" would keep SQLite from
        using its indexes."""
        clauses: list[str] = []
        values: list[Any] = []
        for column, value in given.items():
            if value is None:
                continue
            if isinstance(value, list | tuple):
                clauses.append(f"{column} IN ({','.join([self._mark] * len(value))})")
                values += value
            else:
                clauses.append(f"{column} = {self._mark}")
                values.append(value)
        return clauses, values

    # -- reads ----------------------------------------------------------------------------------

    def call(self, call_id: str) -> CallRecord | None:
        if not self._holdable(call_id):
            return None
        rows = self._fetch(
            f"SELECT {CALL_COLUMNS} FROM {self._calls} WHERE call_id = {self._mark}", (call_id,)
        )
        return call_record(rows[0]) if rows else None

    def calls(
        self,
        states: Iterable[CallState] | None = None,
        *,
        run_id: str | None = None,
        tenant: str | None = None,
    ) -> list[CallRecord]:
        wanted = None if states is None else list(states)
        if wanted == []:
            return []
        clauses, values = self._where({"state": wanted, "run_id": run_id, "tenant": tenant})
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._fetch(
            f"SELECT {CALL_COLUMNS} FROM {self._calls}{where} ORDER BY started_at", values
        )
        return [call_record(row) for row in rows]

    def action(self, action_id: str) -> ActionRecord | None:
        if not self._holdable(action_id):
            return None
        rows = self._fetch(
            f"SELECT {ACTION_COLUMNS} FROM {self._actions} WHERE action_id = {self._mark}",
            (action_id,),
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
    ) -> list[ActionRecord]:
        given = {"state": state, "run_id": run_id, "name": name, "tenant": tenant}
        if call_id is not None:
            rows = self._actions_of(call_id, *self._where(given))
        else:
            clauses, values = self._where(given)
            where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
            rows = self._fetch(
                f"SELECT {ACTION_COLUMNS} FROM {self._actions}{where} "
                "ORDER BY suspended_at, action_id",
                values,
            )
        return [action_record(row, self._schemas) for row in rows]

    def _actions_of(
        self, call_id: str, clauses: list[str], values: list[Any]
    ) -> list[tuple[Any, ...]]:
        """The rows of ``call_id``'s actions that pass ``clauses``, oldest first."""
        clauses = [f"call_id = {self._mark}", *clauses]
        return self._fetch(
            f"SELECT {ACTION_COLUMNS} FROM {self._actions} WHERE {' AND '.join(clauses)} "
            "ORDER BY suspended_at, action_id",
            [call_id, *values],
        )

    def data(self, call_id: str, channel: str | None = None) -> list[DataRecord]:
        clauses, values = self._where({"call_id": call_id, "channel": channel})
        rows = self._fetch(
            f"SELECT {DATA_COLUMNS} FROM {self._data} WHERE {' AND '.join(clauses)} "
            "ORDER BY seq",
            values,
        )
        return [data_record(row) for row in rows]

    def file(self, file_id: str) -> FileRecord | None:
        if not self._holdable(file_id):
            return None
        rows = self._fetch(
            f"SELECT {FILE_COLUMNS} FROM {self._files} WHERE file_id = {self._mark}", (file_id,)
        )
        return file_record(rows[0]) if rows else None

    def file_content(self, file_id: str) -> bytes | None:
        if not self._holdable(file_id):
            return None
        rows = self._fetch(
            f"SELECT content FROM {self._files} WHERE file_id = {self._mark}", (file_id,)
        )
        return bytes(rows[0][0]) if rows else None

    def trigger(self, trigger_id: str) -> TriggerRecord | None:
        if not self._holdable(trigger_id):
            return None
        rows = self._fetch(
            f"SELECT {TRIGGER_COLUMNS} FROM {self._triggers} WHERE trigger_id = {self._mark}",
            (trigger_id,),
        )
        return trigger_record(rows[0]) if rows else None

    def triggers(
        self, *, state: TriggerState | None = None, run_id: str | None = None
    ) -> list[TriggerRecord]:
        clauses, values = self._where({"state": state, "run_id": run_id})
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._fetch(
            f"SELECT {TRIGGER_COLUMNS} FROM {self._triggers}{where} ORDER BY seq", values
        )
        return [trigger_record(row) for row in rows]

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
        clauses, values = self._where(key)
        rows = self._fetch(
            f"SELECT {GRANT_COLUMNS} FROM {self._grants} WHERE {' AND '.join(clauses)}", values
        )
        return grant_record(rows[0]) if rows else None

    def grants(
        self,
        *,
        tenant: str | None = None,
        principal: str | None = None,
        tool: str | None = None,
    ) -> list[GrantRecord]:
        clauses, values = self._where({"tenant": tenant, "principal": principal, "tool": tool})
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._fetch(
            f"SELECT {GRANT_COLUMNS} FROM {self._grants}{where} ORDER BY created_at, grant_id",
            values,
        )
        return [grant_record(row) for row in rows]

    def expired(self, limit: int = 100) -> list[ActionRecord]:
        # Deadlines are the runtime's clock (it computes expires_at), on every store.
        rows = self._fetch(
            f"SELECT {ACTION_COLUMNS} FROM {self._actions} WHERE state = 'pending' "
            f"AND expires_at IS NOT NULL AND expires_at <= {self._mark} "
            f"ORDER BY expires_at LIMIT {self._mark}",
            (clock(), limit),
        )
        return [action_record(row, self._schemas) for row in rows]

    # -- migrations -----------------------------------------------------------------------------

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
