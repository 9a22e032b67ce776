"""The SQLite store's schema and its history: ``MIGRATIONS[n]`` (its statements, in one
transaction) takes version n (``PRAGMA user_version``) to n+1; a statement named ``@step`` is a
Python function of ``STEPS`` (data moved or computed as a schema changes)."""

from __future__ import annotations

import sqlite3

from blade_runtime.core.context import parent_ids
from blade_runtime.core.store import clock
from blade_runtime.core.store import dump_json as _dump

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 1: the first release
        """
        CREATE TABLE calls (
            call_id TEXT PRIMARY KEY,
            run_id TEXT NOT NULL,
            name TEXT NOT NULL,
            spec_id TEXT NOT NULL,
            side_effect TEXT NOT NULL,
            execution TEXT NOT NULL,
            input TEXT NOT NULL,
            state TEXT NOT NULL,
            started_at TEXT NOT NULL,
            owner TEXT NOT NULL,
            entry TEXT,
            result TEXT
        ) WITHOUT ROWID
        """,
        """
        CREATE TABLE actions (
            action_id TEXT PRIMARY KEY,
            call_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            name TEXT NOT NULL,
            spec_id TEXT NOT NULL,
            point TEXT,
            payload TEXT NOT NULL,
            submit_schema TEXT NOT NULL,
            suspended_at TEXT NOT NULL,
            state TEXT NOT NULL,
            resume TEXT,
            resolved_at TEXT,
            reason TEXT
        ) WITHOUT ROWID
        """,
        """
        CREATE INDEX actions_pending ON actions (run_id, name) WHERE state = 'pending'
        """,
        """
        CREATE INDEX actions_call ON actions (call_id)
        """,
        """
        CREATE TABLE data (
            seq INTEGER PRIMARY KEY,
            call_id TEXT NOT NULL,
            channel TEXT NOT NULL,
            item_id TEXT NOT NULL,
            value TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            UNIQUE (call_id, channel, item_id)
        )
        """,
        """
        CREATE TABLE events (
            seq INTEGER PRIMARY KEY,  -- not AUTOINCREMENT: nothing is deleted, it costs a write
            run_id TEXT NOT NULL,
            call_id TEXT NOT NULL,
            kind TEXT NOT NULL,
            payload TEXT NOT NULL,
            at TEXT NOT NULL
        )
        """,
    ),
    (  # 2: leases, tenants, the caller's context, action deadlines
        "ALTER TABLE calls ADD COLUMN lease_until REAL NOT NULL DEFAULT 0",
        "ALTER TABLE calls ADD COLUMN tenant TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE calls ADD COLUMN context TEXT",
        "ALTER TABLE actions ADD COLUMN tenant TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE actions ADD COLUMN expires_at REAL",
        # Sweeps read only the calls that may need a runtime: a partial index stays small.
        "CREATE INDEX calls_open ON calls (state) WHERE state IN ('running', 'resumable')",
        "CREATE INDEX calls_run ON calls (run_id)",
        "CREATE INDEX actions_expiring ON actions (expires_at) "
        "WHERE state = 'pending' AND expires_at IS NOT NULL",
    ),
    (  # 3: owners find their running calls, and calls their actions, without per-state indexes
        """
        CREATE TABLE runtimes (
            owner TEXT PRIMARY KEY,
            lease_until REAL NOT NULL,  -- no later than the lease of any call it holds
            since INTEGER NOT NULL,  -- calls granted to it later have an event after this seq
            held TEXT NOT NULL  -- calls granted up to since that may still run (JSON, no brackets)
        ) WITHOUT ROWID
        """,
        "ALTER TABLE calls ADD COLUMN action_ids TEXT",  # the action ids, JSON, without brackets
        "DROP INDEX calls_open",
        "CREATE INDEX calls_resumable ON calls (started_at) WHERE state = 'resumable'",
        "@owners_and_action_ids",  # the data of the two new columns and table, in Python
        "DROP INDEX actions_call",
    ),
    (  # 4: files tools saved, and triggers to deliver
        # A rowid table (not WITHOUT ROWID): its rows hold whole files.
        """
        CREATE TABLE files (
            file_id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            name TEXT NOT NULL,
            media_type TEXT NOT NULL,
            size INTEGER NOT NULL,
            sha256 TEXT NOT NULL,
            created_at TEXT NOT NULL,
            call_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            creator TEXT,
            thread_id TEXT,
            content BLOB NOT NULL
        )
        """,
        """
        CREATE TABLE triggers (
            seq INTEGER PRIMARY KEY,
            trigger_id TEXT NOT NULL UNIQUE,
            call_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            name TEXT NOT NULL,
            tenant TEXT NOT NULL,
            input TEXT NOT NULL,
            created_at TEXT NOT NULL,
            context TEXT,
            thread_id TEXT,
            state TEXT NOT NULL,
            owner TEXT NOT NULL,
            claimed_until REAL NOT NULL,
            finished_at TEXT,
            error TEXT
        )
        """,
        # Deliveries read only the triggers not yet delivered.
        "CREATE INDEX triggers_open ON triggers (seq) WHERE state IN ('pending', 'claimed')",
    ),
    (  # 5: a call's narrowed kind and its fencing token; standing permission grants
        "ALTER TABLE calls ADD COLUMN kind TEXT",
        "ALTER TABLE calls ADD COLUMN fence INTEGER NOT NULL DEFAULT 0",
        """
        CREATE TABLE grants (
            grant_id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            principal TEXT NOT NULL,
            tool TEXT NOT NULL,
            subject TEXT NOT NULL,
            created_at TEXT NOT NULL,
            action_id TEXT,
            spec_id TEXT NOT NULL,
            point TEXT NOT NULL,
            UNIQUE (tenant, principal, tool, spec_id, point, subject)
        ) WITHOUT ROWID
        """,
    ),
    (  # 6: one set of rules for every engine: tables named as PostgreSQL's, whose a record is
        # (tenant and principal) on calls, actions and events, a call's root on what it wrote,
        # its settling time for retention, and the indexes paged listings and prunes read
        *(
            f"ALTER TABLE {old} RENAME TO blade_{old}"
            for old in (
                "calls",
                "actions",
                "data",
                "events",
                "files",
                "triggers",
                "grants",
                "runtimes",
            )
        ),
        "ALTER TABLE blade_calls ADD COLUMN principal TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE blade_calls ADD COLUMN settled_at REAL",
        "ALTER TABLE blade_actions ADD COLUMN principal TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE blade_events ADD COLUMN tenant TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE blade_events ADD COLUMN principal TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE blade_events ADD COLUMN root_id TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE blade_data ADD COLUMN root_id TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE blade_files ADD COLUMN root_id TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE blade_triggers ADD COLUMN root_id TEXT NOT NULL DEFAULT ''",
        "@whose_and_roots",  # the new columns' data, in Python
        "DROP INDEX calls_run",
        # Listings: keys that never change, so a row's entries are written once, at its insert.
        "CREATE INDEX blade_calls_run ON blade_calls (run_id, started_at, call_id)",
        "CREATE INDEX blade_actions_call ON blade_actions (call_id)",
        "CREATE INDEX blade_actions_tenant ON blade_actions (tenant, suspended_at, action_id)",
        "CREATE INDEX blade_actions_waiting ON blade_actions (suspended_at, action_id) "
        "WHERE state = 'pending'",
        "CREATE INDEX blade_grants_owner ON blade_grants (tenant, principal, created_at, grant_id)",
        # A subscriber reads its own run's events, whatever else was written since.
        "CREATE INDEX blade_events_run ON blade_events (run_id, seq)",
        # Retention: the settled calls oldest first, and everything of theirs.
        "CREATE INDEX blade_calls_settled ON blade_calls (settled_at, call_id) "
        "WHERE settled_at IS NOT NULL",
        "CREATE INDEX blade_events_root ON blade_events (root_id)",
        "CREATE INDEX blade_data_root ON blade_data (root_id)",
        "CREATE INDEX blade_files_root ON blade_files (root_id)",
        "CREATE INDEX blade_triggers_root ON blade_triggers (root_id)",
    ),
    (  # 7: concurrency slots and resource locks (core.slots): each call's place in each queue
        """
        CREATE TABLE blade_slots (
            slot_key TEXT NOT NULL,
            call_id TEXT NOT NULL,
            owner TEXT NOT NULL,
            ticket REAL NOT NULL,
            capacity INTEGER NOT NULL,
            held INTEGER NOT NULL,
            lease_until REAL NOT NULL,
            tenant TEXT NOT NULL,
            run_id TEXT NOT NULL,
            name TEXT NOT NULL,
            PRIMARY KEY (slot_key, call_id, owner)
        ) WITHOUT ROWID
        """,
        "CREATE INDEX blade_slots_call ON blade_slots (call_id, owner)",
        "CREATE INDEX blade_slots_owner ON blade_slots (owner)",
    ),
    (  # 8: an action's origin names its call's thread and executing agent (seed 002)
        "ALTER TABLE blade_actions ADD COLUMN thread_id TEXT",
        "ALTER TABLE blade_actions ADD COLUMN agent_id TEXT",
        *(
            f"UPDATE blade_actions SET {key} = json_extract(c.context, '$.{key}') "
            f"FROM blade_calls c WHERE c.call_id = blade_actions.call_id "
            f"AND json_valid(c.context) AND json_type(c.context, '$.{key}') = 'text'"
            for key in ("thread_id", "agent_id")
        ),
    ),
    (  # 9: effects tools emit (core.effects): a run's context patches, messages, permission changes
        """
        CREATE TABLE blade_effects (
            seq INTEGER PRIMARY KEY,  -- the seq of its event
            effect_id TEXT NOT NULL UNIQUE,
            run_id TEXT NOT NULL,
            call_id TEXT NOT NULL,
            tenant TEXT NOT NULL,
            principal TEXT NOT NULL,
            kind TEXT NOT NULL,
            payload TEXT NOT NULL,
            at TEXT NOT NULL,
            root_id TEXT NOT NULL
        )
        """,
        "CREATE INDEX blade_effects_run ON blade_effects (run_id, tenant, principal, seq)",
        "CREATE INDEX blade_effects_root ON blade_effects (root_id)",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)


def _owners_and_action_ids(db: sqlite3.Connection) -> None:
    """Migration 3's data: a runtimes row per owner of running calls, and each call's actions."""
    head = db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]
    held: dict[str, tuple[list[str], float]] = {}
    for owner, call_id, lease_until in db.execute(
        "SELECT owner, call_id, lease_until FROM calls WHERE state = 'running'"
    ):
        ids, earliest = held.get(owner, ([], lease_until))
        ids.append(call_id)
        held[owner] = (ids, min(earliest, lease_until))
    db.executemany(
        "INSERT INTO runtimes (owner, lease_until, since, held) VALUES (?, ?, ?, ?)",
        [(owner, earliest, head, _dump(ids)[1:-1]) for owner, (ids, earliest) in held.items()],
    )
    listed: dict[str, list[str]] = {}
    for call_id, action_id in db.execute("SELECT call_id, action_id FROM actions"):
        listed.setdefault(call_id, []).append(action_id)
    db.executemany(
        "UPDATE calls SET action_ids = ? WHERE call_id = ?",
        [(_dump(ids)[1:-1], call_id) for call_id, ids in listed.items()],
    )


def _whose_and_roots(db: sqlite3.Connection) -> None:
    """Migration 6's data: each call's principal (from its stored context) and, for retention,
    the settling time of those settled (the migration's: kept a whole retention period from
    now); each action's and event's tenant and principal, and what a call wrote its root's id
    (a child's events and ToolData are its outermost recorded call's). Set-wise: a store may
    hold millions of rows."""
    principal = (
        "CASE WHEN json_valid(context) AND json_type(context, '$.principal.id') = 'text' "
        "THEN json_extract(context, '$.principal.id') ELSE '' END"
    )
    db.execute(f"UPDATE blade_calls SET principal = {principal}")
    db.execute("UPDATE blade_calls SET settled_at = ? WHERE state = 'settled'", (clock(),))
    db.execute(
        "UPDATE blade_actions SET principal = c.principal FROM blade_calls c "
        "WHERE c.call_id = blade_actions.call_id"
    )
    db.execute("CREATE TEMP TABLE blade_roots (call_id TEXT PRIMARY KEY, root_id TEXT NOT NULL)")
    for table in ("blade_events", "blade_data", "blade_files", "blade_triggers"):
        children = [
            (call_id, parents[0])
            for (call_id,) in db.execute(
                f"SELECT DISTINCT call_id FROM {table} WHERE call_id NOT IN "
                "(SELECT call_id FROM blade_calls)"
            )
            if (parents := [p for p in parent_ids(call_id) if _recorded(db, p)])
        ]
        db.executemany("INSERT OR IGNORE INTO blade_roots VALUES (?, ?)", children)
        db.execute(
            f"UPDATE {table} SET root_id = COALESCE((SELECT r.root_id FROM blade_roots r "
            f"WHERE r.call_id = {table}.call_id), call_id)"
        )
    db.execute(
        "UPDATE blade_events SET tenant = c.tenant, principal = c.principal FROM blade_calls c "
        "WHERE c.call_id = blade_events.root_id"
    )
    db.execute("DROP TABLE blade_roots")


def _recorded(db: sqlite3.Connection, call_id: str) -> bool:
    return (
        db.execute("SELECT 1 FROM blade_calls WHERE call_id = ?", (call_id,)).fetchone() is not None
    )


STEPS = {
    "@owners_and_action_ids": _owners_and_action_ids,
    "@whose_and_roots": _whose_and_roots,
}
