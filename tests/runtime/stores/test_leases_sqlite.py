"""SQLiteStore's way of finding the calls that need a runtime (since schema 3): no index follows
a call's state, so sweeps find running calls through their owner's ``blade_runtimes`` row (the
calls it lists, and those granted to it after its ``since``).

These are the cases the conformance suite does not reach: a call found through the list a
renewal or an earlier sweep left, an owner whose row a sweep dropped and that grants again, and
a store of schema 2 (written by the previous release) that opens with its calls still found.
Also: a subclass's ``connection_class`` runs every statement (bench/pending.py records a cycle's).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from records import a_call, an_action, begun, ev, suspend_on

from blade_runtime.core.store import ActionRecord, CallRecord, Resolution, clock, now
from blade_runtime.stores.sqlite import SQLiteStore
from blade_runtime.stores.sqlite_schema import MIGRATIONS, SCHEMA_VERSION


def resumed(store: SQLiteStore, call: CallRecord, action: ActionRecord, owner: str) -> None:
    """``action`` submitted, and ``call`` running again under ``owner``."""
    resolution = Resolution("submitted", now(), {}, call_state="running", call_owner=owner)
    resolved = store.resolve(action.action_id, resolution, ev(call, "resumed"))
    call.state, call.owner, call.fence = "running", owner, resolved.call_fence


def others_work(store: SQLiteStore, count: int = 20) -> None:
    """Events of another owner's short calls, so that the ones of interest are not the last."""
    for _ in range(count):
        call = begun(store, owner="busy")
        store.settle(call.claim, 1, ev(call, "result"))


def test_a_call_listed_by_a_renewal_is_found_when_its_owner_dies(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    early = begun(store, owner="w1")
    assert store.renew("w1", 30.0) == {early.call_id}  # the row now lists it, since moved past
    others_work(store)
    late = begun(store, owner="w1")  # found from the events after since
    others_work(store)
    assert store.claim("me", 30.0) == []  # alive, leased
    taken = store.claim("me", 30.0, dead={"w1"})
    assert {c.call.call_id for c in taken} == {early.call_id, late.call_id}
    assert store.claim("me", 30.0, dead={"w1"}) == []


def test_a_sweep_keeps_what_it_could_not_take_yet(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    leased = begun(store, owner="w1", lease_s=60.0)
    lapsed = begun(store, owner="w1", lease_s=-1.0)  # the row comes due: sweeps look at w1
    others_work(store)
    [taken] = store.claim("me", 30.0)
    assert taken.call.call_id == lapsed.call_id
    others_work(store)  # the sweep moved since past the leased call's start: it is listed
    [later] = store.claim("me", 30.0, dead={"w1"})
    assert later.call.call_id == leased.call_id


def test_a_lease_that_runs_out_is_found_by_a_later_sweep(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    call = begun(store, owner="w1", lease_s=1.0)  # a second: room for a busy machine
    assert store.claim("me", 30.0) == []
    time.sleep(1.1)
    [taken] = store.claim("me", 30.0)
    assert (taken.call.call_id, taken.previous_owner) == (call.call_id, "w1")


def test_an_owner_whose_row_a_sweep_dropped_grants_again(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    lost = begun(store, owner="w1", lease_s=-1.0)
    [taken] = store.claim("me", 30.0)  # w1 holds nothing now: its row goes
    assert taken.call.call_id == lost.call_id
    assert store.renew("w1", 30.0) == set()
    again = begun(store, owner="w1", lease_s=-1.0)
    [retaken] = SQLiteStore(tmp_path / "s.db").claim("other", 30.0)  # another worker
    assert retaken.call.call_id == again.call_id
    fresh = begun(store, owner="w1")
    assert store.renew("w1", 30.0) == {fresh.call_id}


def test_a_resumed_call_is_found_through_the_runtime_that_resumed_it(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    call = begun(store, owner="w1")
    resumed(store, call, suspend_on(store, call), owner="w2")
    others_work(store)
    assert store.claim("me", 30.0, dead={"w1"}) == []  # no longer w1's
    [taken] = store.claim("me", 30.0, dead={"w2"})
    assert (taken.call.call_id, taken.previous_owner) == (call.call_id, "w2")


def test_a_call_lists_its_actions(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    call = begun(store, owner="w1")
    first = suspend_on(store, call)
    resumed(store, call, first, owner="w1")
    second = suspend_on(store, call)
    client = a_call(owner="w1", state="pending")  # a client tool's call: recorded with it
    third = an_action(client)
    store.suspend(client, third, ev(client, "pending"))
    assert [a.action_id for a in store.actions(state=None, call_id=call.call_id)] == [
        first.action_id,
        second.action_id,
    ]
    assert [a.action_id for a in store.actions(call_id=call.call_id)] == [second.action_id]
    assert [a.action_id for a in store.actions(call_id=client.call_id)] == [third.action_id]
    assert store.actions(call_id="no-such-call") == []


def test_a_store_of_schema_2_opens_with_its_calls_and_actions_found(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    for statement in (*MIGRATIONS[0], *MIGRATIONS[1]):
        db.execute(statement)
    db.execute("PRAGMA user_version=2")
    columns = (
        "call_id, run_id, name, spec_id, side_effect, execution, input, state, started_at, "
        "owner, entry, result, lease_until"
    )
    at = clock()
    rows = [
        ("c-lapsed", "running", "w-old", at - 1),
        ("c-leased", "running", "w-old", at + 60),
        ("c-ready", "resumable", "w-old", 0.0),
        ("c-waiting", "suspended", "w-old", 0.0),
    ]
    for call_id, state, owner, lease_until in rows:
        db.execute(
            f"INSERT INTO calls ({columns}) VALUES (?, 'run-1', 'refund', 'acme.refund.v1', "
            "'idempotent', 'inline', '{}', ?, ?, ?, 'null', 'null', ?)",
            (call_id, state, now(), owner, lease_until),
        )
    for action_id in ("a-1", "a-2"):
        db.execute(
            "INSERT INTO actions (action_id, call_id, run_id, name, spec_id, point, payload, "
            "submit_schema, suspended_at, state) VALUES (?, 'c-waiting', 'run-1', 'refund', "
            "'acme.refund.v1', 'approve', '{}', '{}', ?, 'pending')",
            (action_id, now()),
        )
    db.execute(
        "INSERT INTO events (run_id, call_id, kind, payload, at) VALUES "
        "('run-1', 'c-lapsed', 'started', '{}', 'then')"
    )
    db.close()

    store = SQLiteStore(path)
    with sqlite3.connect(path) as check:
        assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert [a.action_id for a in store.actions(call_id="c-waiting")] == ["a-1", "a-2"]
    claimed = {c.call.call_id: c.was for c in store.claim("me", 30.0)}
    assert claimed == {"c-lapsed": "running", "c-ready": "resumable"}
    [leased] = store.claim("me", 30.0, dead={"w-old"})
    assert leased.call.call_id == "c-leased"
    assert "w-old" not in store.owners()


def test_a_call_granted_after_a_wrong_death_verdict_is_still_found(tmp_path: Path) -> None:
    """Another store's sweep took w1's calls on a verdict that w1 died (wrongly) and dropped its
    row; w1 then begins again through its own store object: its renewal keeps the new call, and
    when w1 really dies the call is claimable."""
    mine, theirs = SQLiteStore(tmp_path / "s.db"), SQLiteStore(tmp_path / "s.db")
    first = begun(mine, owner="w1")
    assert [c.call.call_id for c in theirs.claim("w2", 30.0, dead={"w1"})] == [first.call_id]
    second = begun(mine, owner="w1")
    assert mine.renew("w1", 30.0) == {second.call_id}
    assert [c.call.call_id for c in theirs.claim("w2", 30.0, dead={"w1"})] == [second.call_id]


def test_every_statement_runs_on_the_connection_class_a_subclass_names(tmp_path: Path) -> None:
    seen: list[str] = []

    class Traced(sqlite3.Connection):
        def execute(self, sql: str, parameters: object = (), /) -> sqlite3.Cursor:
            seen.append(" ".join(sql.split()[:3]))
            return super().execute(sql, parameters)  # type: ignore[arg-type]

    class TracedStore(SQLiteStore):
        connection_class = Traced

    store = TracedStore(tmp_path / "traced.db")
    call = a_call(owner="owner-a")
    store.begin(call, ev(call, "started"))
    assert store.call(call.call_id) is not None
    store.close()
    assert "INSERT INTO blade_calls" in seen and "BEGIN IMMEDIATE" in seen, seen
    assert any(statement.startswith("SELECT") for statement in seen), seen


def test_a_sweep_that_changes_nothing_writes_nothing(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    lapsed = begun(store, owner="w1", lease_s=-1.0)  # due, but of a tool nobody here serves
    assert store.claim("me", 30.0, names={"another"}) == []  # the row gets its list
    db = store._connection()
    before = db.total_changes
    assert store.claim("me", 30.0, names={"another"}) == []
    assert db.total_changes == before  # the row stayed as it was: not rewritten
    [taken] = store.claim("me", 30.0)
    assert taken.call.call_id == lapsed.call_id


def test_a_sweep_whose_own_row_came_due_keeps_what_it_claims(tmp_path: Path) -> None:
    # Found by the four-worker kill test: the sweeping owner's own row was due (its lease_until
    # the lease of a call that had ended), so the sweep rewrote it after granting: dropped, as
    # an owner holding nothing, and its next renewal no longer found the call it had just
    # claimed (the heartbeat then cancelled it, and the cancellation was recorded).
    store = SQLiteStore(tmp_path / "s.db")
    ended = begun(store, owner="me", lease_s=-1.0)
    store.settle(ended.claim, 1, ev(ended, "result"))  # its row stays, due
    lost = begun(store, owner="w1", lease_s=60.0)
    [taken] = store.claim("me", 30.0, dead={"w1"})
    assert taken.call.call_id == lost.call_id
    assert store.renew("me", 30.0) == {lost.call_id}
    assert store.claim("other", 30.0, dead={"w1"}) == []  # leased to a live owner
    [retaken] = store.claim("other", 30.0, dead={"me"})
    assert retaken.call.call_id == lost.call_id
