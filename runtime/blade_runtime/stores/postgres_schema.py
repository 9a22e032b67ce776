"""The PostgreSQL store's schema and its history: ``MIGRATIONS[n]`` takes version n (the row of
``blade_schema_version``) to n+1, in one transaction under an advisory lock; and the advisory
lock keys the store and its functions share."""

from __future__ import annotations

from typing import LiteralString

LOCK_CLASS = 0x626C6164  # "blad": the (int, int) advisory key space of this store
EVENTS_LOCK = 1  # migration 1's; a run's events lock since migration 2
MIGRATION_LOCK = 2
LISTENER_CLASS = LOCK_CLASS + 1  # (class, key): the session lock of a listening store
RUN_CLASS = LOCK_CLASS + 2  # (class, hashtext(run_id)): a run's events lock
SLOT_CLASS = LOCK_CLASS + 3  # (class, hashtext(slot_key)): a slot key's queue
CHANNEL = "blade_events"


def _grant_like(
    source: LiteralString, privileges: LiteralString, tables: LiteralString
) -> LiteralString:
    """A migration statement: every role that may insert into ``source`` (other than its owner)
    gets ``privileges`` on the new ``tables``, so an application role that uses the earlier
    tables keeps working after the upgrade."""
    return f"""
        DO $$
        DECLARE
            grantee_name text;
        BEGIN
            FOR grantee_name IN
                SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                    ELSE quote_ident(pg_get_userbyid(a.grantee)) END
                FROM pg_class c, aclexplode(c.relacl) a
                WHERE c.oid = '{source}'::regclass AND a.privilege_type = 'INSERT'
                    AND a.grantee <> c.relowner
            LOOP
                EXECUTE 'GRANT {privileges} ON {tables} TO ' || grantee_name;
            END LOOP;
        END
        $$
        """


MIGRATIONS: tuple[tuple[LiteralString, ...], ...] = (
    (  # 1: the first release
        """
        CREATE TABLE blade_calls (
            call_id text PRIMARY KEY,
            run_id text NOT NULL,
            name text NOT NULL,
            spec_id text NOT NULL,
            side_effect text NOT NULL,
            execution text NOT NULL,
            input text NOT NULL,
            state text NOT NULL,
            started_at text NOT NULL,
            owner text NOT NULL,
            entry text,
            result text,
            lease_until double precision NOT NULL DEFAULT 0,
            tenant text NOT NULL DEFAULT '',
            context text
        )
        """,
        # Sweeps read only the calls that may need a runtime: a partial index stays small.
        "CREATE INDEX blade_calls_open ON blade_calls (state, lease_until) "
        "WHERE state IN ('running', 'resumable')",
        "CREATE INDEX blade_calls_run ON blade_calls (run_id)",
        """
        CREATE TABLE blade_actions (
            action_id text PRIMARY KEY,
            call_id text NOT NULL,
            run_id text NOT NULL,
            name text NOT NULL,
            spec_id text NOT NULL,
            point text,
            payload text NOT NULL,
            submit_schema text NOT NULL,
            suspended_at text NOT NULL,
            state text NOT NULL,
            resume text,
            resolved_at text,
            reason text,
            tenant text NOT NULL DEFAULT '',
            expires_at double precision
        )
        """,
        "CREATE INDEX blade_actions_pending ON blade_actions (run_id, name) "
        "WHERE state = 'pending'",
        "CREATE INDEX blade_actions_call ON blade_actions (call_id)",
        "CREATE INDEX blade_actions_expiring ON blade_actions (expires_at) "
        "WHERE state = 'pending' AND expires_at IS NOT NULL",
        """
        CREATE TABLE blade_data (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            call_id text NOT NULL,
            channel text NOT NULL,
            item_id text NOT NULL,
            value text NOT NULL,
            updated_at text NOT NULL,
            UNIQUE (call_id, channel, item_id)
        )
        """,
        """
        CREATE TABLE blade_events (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            run_id text NOT NULL,
            call_id text NOT NULL,
            kind text NOT NULL,
            payload text NOT NULL,
            at text NOT NULL
        )
        """,
        "CREATE INDEX blade_events_run ON blade_events (run_id, seq)",
        """
        CREATE TABLE blade_runtimes (
            owner text PRIMARY KEY,
            attached_at text NOT NULL
        )
        """,
        # The one way events are appended (migration 2 replaces it).
        f"""
        CREATE FUNCTION blade_event(
            p_run_id text, p_call_id text, p_kind text, p_payload text, p_at text
        ) RETURNS bigint LANGUAGE plpgsql AS $$
        DECLARE
            numbered bigint;
        BEGIN
            PERFORM pg_advisory_xact_lock({LOCK_CLASS}, {EVENTS_LOCK});
            INSERT INTO blade_events (run_id, call_id, kind, payload, at)
                VALUES (p_run_id, p_call_id, p_kind, p_payload, p_at)
                RETURNING seq INTO numbered;
            PERFORM pg_notify('{CHANNEL}', numbered::text);
            RETURN numbered;
        END
        $$
        """,
    ),
    (  # 2: writers no longer wait for each other's commits; NOTIFY only while someone listens
        # The stores that LISTEN, each by the session lock it holds (a free lock: it is gone).
        "CREATE TABLE blade_listeners (key integer PRIMARY KEY, since text NOT NULL)",
        # Every event append reads it: a role that may append events (granted on the tables of
        # the first release) may read it, and list itself as a listener.
        _grant_like("blade_events", "SELECT, INSERT, DELETE", "blade_listeners"),
        # Appending an event takes its run's lock SHARED before its number is drawn, and holds
        # it to the commit: writers do not wait for each other's commits, and a reader that
        # takes it exclusively waits out every event of the run numbered but not committed.
        f"""
        CREATE OR REPLACE FUNCTION blade_event(
            p_run_id text, p_call_id text, p_kind text, p_payload text, p_at text
        ) RETURNS bigint LANGUAGE plpgsql AS $$
        DECLARE
            numbered bigint;
        BEGIN
            PERFORM pg_advisory_xact_lock_shared({RUN_CLASS}, hashtext(p_run_id));
            INSERT INTO blade_events (run_id, call_id, kind, payload, at)
                VALUES (p_run_id, p_call_id, p_kind, p_payload, p_at)
                RETURNING seq INTO numbered;
            IF EXISTS (SELECT 1 FROM blade_listeners) THEN
                PERFORM pg_notify('{CHANNEL}', numbered::text);
            END IF;
            RETURN numbered;
        END
        $$
        """,
        # A run's events read under its run's lock, held exclusively: none of them is between
        # its number and its commit, so what the query sees (its snapshot is taken after the
        # lock) is every event of the run that will ever have a number up to the largest it
        # sees. Nothing new seen before the lock, nothing is locked: a subscriber woken by
        # another run's event does not stop that run's writers. The lock ends with the
        # transaction (with the statement, on the store's autocommit connections).
        f"""
        CREATE FUNCTION blade_events_after(p_run_id text, p_after bigint)
        RETURNS TABLE (run_id text, call_id text, kind text, payload text, at text, seq bigint)
        LANGUAGE plpgsql AS $$
        BEGIN
            IF NOT EXISTS (
                SELECT 1 FROM blade_events e WHERE e.run_id = p_run_id AND e.seq > p_after
            ) THEN
                RETURN;
            END IF;
            PERFORM pg_advisory_xact_lock({RUN_CLASS}, hashtext(p_run_id));
            RETURN QUERY SELECT e.run_id, e.call_id, e.kind, e.payload, e.at, e.seq
                FROM blade_events e WHERE e.run_id = p_run_id AND e.seq > p_after
                ORDER BY e.seq;
        END
        $$
        """,
        # Where a new subscription to a run starts: the last number, read under the run's lock
        # (the run's events that commit later are numbered after it).
        f"""
        CREATE FUNCTION blade_events_head(p_run_id text) RETURNS bigint LANGUAGE plpgsql AS $$
        BEGIN
            IF p_run_id IS NOT NULL THEN
                PERFORM pg_advisory_xact_lock({RUN_CLASS}, hashtext(p_run_id));
            END IF;
            RETURN (SELECT COALESCE(max(seq), 0) FROM blade_events);
        END
        $$
        """,
    ),
    (  # 3: files tools saved, and triggers to deliver
        """
        CREATE TABLE blade_files (
            file_id text PRIMARY KEY,
            tenant text NOT NULL,
            name text NOT NULL,
            media_type text NOT NULL,
            size bigint NOT NULL,
            sha256 text NOT NULL,
            created_at text NOT NULL,
            call_id text NOT NULL,
            run_id text NOT NULL,
            creator text,
            thread_id text,
            content bytea NOT NULL
        )
        """,
        """
        CREATE TABLE blade_triggers (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            trigger_id text NOT NULL UNIQUE,
            call_id text NOT NULL,
            run_id text NOT NULL,
            name text NOT NULL,
            tenant text NOT NULL,
            input text NOT NULL,
            created_at text NOT NULL,
            context text,
            thread_id text,
            state text NOT NULL,
            owner text NOT NULL,
            claimed_until double precision NOT NULL,
            finished_at text,
            error text
        )
        """,
        # Deliveries read only the triggers not yet delivered.
        "CREATE INDEX blade_triggers_open ON blade_triggers (seq) "
        "WHERE state IN ('pending', 'claimed')",
        # A role that may use the first release's tables may use these.
        _grant_like("blade_calls", "SELECT, INSERT, UPDATE", "blade_files, blade_triggers"),
    ),
    (  # 4: a call's narrowed kind and its fencing token; standing permission grants
        "ALTER TABLE blade_calls ADD COLUMN kind text",
        "ALTER TABLE blade_calls ADD COLUMN fence bigint NOT NULL DEFAULT 0",
        """
        CREATE TABLE blade_grants (
            grant_id text PRIMARY KEY,
            tenant text NOT NULL,
            principal text NOT NULL,
            tool text NOT NULL,
            subject text NOT NULL,
            created_at text NOT NULL,
            action_id text,
            spec_id text NOT NULL,
            point text NOT NULL,
            UNIQUE (tenant, principal, tool, spec_id, point, subject)
        )
        """,
        # A role that may use the first release's tables may use this one.
        _grant_like("blade_calls", "SELECT, INSERT, UPDATE, DELETE", "blade_grants"),
    ),
    (  # 5: one set of rules for every engine: whose a record is (tenant and principal) on
        # calls, actions and events, a call's root on what it wrote, its settling time for
        # retention, the indexes paged listings and prunes read, and guards that end a
        # transaction on the server (one pipelined round trip per transition)
        "ALTER TABLE blade_calls ADD COLUMN principal text NOT NULL DEFAULT ''",
        "ALTER TABLE blade_calls ADD COLUMN settled_at double precision",
        "ALTER TABLE blade_actions ADD COLUMN principal text NOT NULL DEFAULT ''",
        "ALTER TABLE blade_events ADD COLUMN tenant text NOT NULL DEFAULT ''",
        "ALTER TABLE blade_events ADD COLUMN principal text NOT NULL DEFAULT ''",
        "ALTER TABLE blade_events ADD COLUMN root_id text NOT NULL DEFAULT ''",
        "ALTER TABLE blade_data ADD COLUMN root_id text NOT NULL DEFAULT ''",
        "ALTER TABLE blade_files ADD COLUMN root_id text NOT NULL DEFAULT ''",
        "ALTER TABLE blade_triggers ADD COLUMN root_id text NOT NULL DEFAULT ''",
        """
        UPDATE blade_calls SET principal = COALESCE(
            CASE WHEN json_typeof(context::json -> 'principal' -> 'id') = 'string'
            THEN context::json -> 'principal' ->> 'id' END, '')
        WHERE context IS NOT NULL AND context <> 'null'
        """,
        "UPDATE blade_calls SET settled_at = extract(epoch from clock_timestamp()) "
        "WHERE state = 'settled'",
        "UPDATE blade_actions a SET principal = c.principal FROM blade_calls c "
        "WHERE c.call_id = a.call_id",
        # What a child wrote is its outermost recorded call's: the longest prefix of its id,
        # before a "/", that is a recorded call.
        """
        CREATE TEMP TABLE blade_roots ON COMMIT DROP AS
        SELECT DISTINCT ON (w.call_id) w.call_id, c.call_id AS root_id
        FROM (SELECT call_id FROM blade_events UNION SELECT call_id FROM blade_data
              UNION SELECT call_id FROM blade_files UNION SELECT call_id FROM blade_triggers) w
        JOIN blade_calls c ON starts_with(w.call_id, c.call_id || '/')
        ORDER BY w.call_id, length(c.call_id)
        """,
        *(
            f"UPDATE {table} t SET root_id = COALESCE((SELECT r.root_id FROM blade_roots r "
            "WHERE r.call_id = t.call_id), t.call_id)"
            for table in ("blade_events", "blade_data", "blade_files", "blade_triggers")
        ),
        "UPDATE blade_events e SET tenant = c.tenant, principal = c.principal "
        "FROM blade_calls c WHERE c.call_id = e.root_id",
        "DROP INDEX blade_calls_run",
        "CREATE INDEX blade_calls_run ON blade_calls (run_id, started_at, call_id)",
        "CREATE INDEX blade_actions_tenant ON blade_actions (tenant, suspended_at, action_id)",
        "CREATE INDEX blade_actions_waiting ON blade_actions (suspended_at, action_id) "
        "WHERE state = 'pending'",
        "CREATE INDEX blade_grants_owner ON blade_grants (tenant, principal, created_at, grant_id)",
        "CREATE INDEX blade_calls_settled ON blade_calls (settled_at, call_id) "
        "WHERE settled_at IS NOT NULL",
        "CREATE INDEX blade_events_root ON blade_events (root_id)",
        "CREATE INDEX blade_data_root ON blade_data (root_id)",
        "CREATE INDEX blade_files_root ON blade_files (root_id)",
        "CREATE INDEX blade_triggers_root ON blade_triggers (root_id)",
        # A guard of a pipelined transaction: no row, and the transaction ends on the server
        # (what follows it in the pipeline is never run); the tag says which guard.
        """
        CREATE FUNCTION blade_require(p_found bigint, p_tag integer) RETURNS bigint
        LANGUAGE plpgsql AS $$
        BEGIN
            IF p_found = 0 THEN
                RAISE EXCEPTION USING ERRCODE = 'BL001', MESSAGE = p_tag::text;
            END IF;
            RETURN p_found;
        END
        $$
        """,
        "DROP FUNCTION blade_event(text, text, text, text, text)",
        f"""
        CREATE FUNCTION blade_event(
            p_run_id text, p_call_id text, p_kind text, p_payload text, p_at text,
            p_tenant text, p_principal text, p_root_id text
        ) RETURNS bigint LANGUAGE plpgsql AS $$
        DECLARE
            numbered bigint;
        BEGIN
            PERFORM pg_advisory_xact_lock_shared({RUN_CLASS}, hashtext(p_run_id));
            INSERT INTO blade_events
                    (run_id, call_id, kind, payload, at, tenant, principal, root_id)
                VALUES (p_run_id, p_call_id, p_kind, p_payload, p_at, p_tenant, p_principal,
                        p_root_id)
                RETURNING seq INTO numbered;
            IF EXISTS (SELECT 1 FROM blade_listeners) THEN
                PERFORM pg_notify('{CHANNEL}', numbered::text);
            END IF;
            RETURN numbered;
        END
        $$
        """,
        # A page of a run's events a principal may see, read under the run's lock as
        # blade_events_after reads them (nothing of the run between its number and its commit).
        f"""
        CREATE FUNCTION blade_events_page(
            p_run_id text, p_after bigint, p_limit bigint, p_tenant text, p_principal text
        ) RETURNS TABLE (run_id text, call_id text, kind text, payload text, at text, seq bigint,
                         tenant text, principal text)
        LANGUAGE plpgsql AS $$
        BEGIN
            IF NOT EXISTS (
                SELECT 1 FROM blade_events e WHERE e.run_id = p_run_id AND e.seq > p_after
            ) THEN
                RETURN;
            END IF;
            PERFORM pg_advisory_xact_lock({RUN_CLASS}, hashtext(p_run_id));
            RETURN QUERY SELECT e.run_id, e.call_id, e.kind, e.payload, e.at, e.seq, e.tenant,
                    e.principal
                FROM blade_events e WHERE e.run_id = p_run_id AND e.seq > p_after
                    AND (p_tenant IS NULL OR e.tenant = p_tenant)
                    AND (p_principal IS NULL OR e.principal IN ('', p_principal))
                ORDER BY e.seq LIMIT p_limit;
        END
        $$
        """,
    ),
    (  # 6: concurrency slots and resource locks (core.slots): each call's place in each queue
        """
        CREATE TABLE blade_slots (
            slot_key text NOT NULL,
            call_id text NOT NULL,
            owner text NOT NULL,
            ticket double precision NOT NULL,
            capacity integer NOT NULL,
            held integer NOT NULL,
            lease_until double precision NOT NULL,
            tenant text NOT NULL,
            run_id text NOT NULL,
            name text NOT NULL,
            PRIMARY KEY (slot_key, call_id, owner)
        )
        """,
        "CREATE INDEX blade_slots_call ON blade_slots (call_id, owner)",
        "CREATE INDEX blade_slots_owner ON blade_slots (owner)",
    ),
    (  # 7: an action's origin names its call's thread and executing agent (seed 002)
        "ALTER TABLE blade_actions ADD COLUMN thread_id text",
        "ALTER TABLE blade_actions ADD COLUMN agent_id text",
        """
        UPDATE blade_actions a SET
            thread_id = CASE WHEN json_typeof(c.context::json -> 'thread_id') = 'string'
                THEN c.context::json ->> 'thread_id' END,
            agent_id = CASE WHEN json_typeof(c.context::json -> 'agent_id') = 'string'
                THEN c.context::json ->> 'agent_id' END
        FROM blade_calls c
        WHERE c.call_id = a.call_id AND c.context IS NOT NULL AND c.context <> 'null'
        """,
    ),
    (  # 8: effects tools emit (core.effects): a run's context patches, messages, permission changes
        """
        CREATE TABLE blade_effects (
            seq bigint PRIMARY KEY,  -- the seq of its event
            effect_id text NOT NULL UNIQUE,
            run_id text NOT NULL,
            call_id text NOT NULL,
            tenant text NOT NULL,
            principal text NOT NULL,
            kind text NOT NULL,
            payload text NOT NULL,
            at text NOT NULL,
            root_id text NOT NULL
        )
        """,
        "CREATE INDEX blade_effects_run ON blade_effects (run_id, tenant, principal, seq)",
        "CREATE INDEX blade_effects_root ON blade_effects (root_id)",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)
