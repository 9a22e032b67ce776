"""One suite of every ``Store`` behaviour, run on MemoryStore, SQLiteStore and PostgresStore.

The store methods are called directly with records (no Runtime). Each rule is written once
(``stores/sql.py``) and tested once, here, on all three engines; where MemoryStore differs by
its documentation (it is not shared with other processes, nothing outside it writes), the test
asserts what it documents instead of skipping.
PostgreSQL is a real server (``tests/postgres.py``): a missing one fails these tests. What only
one engine does is tested beside it: test_sqlite_store.py, test_postgres_store.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import forked
import pytest
import store_workers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from records import (
    a_call,
    an_action,
    begun,
    ev,
    kinds,
    one_line,
    resumable,
    submitted,
    suspended,
    uid,
)
from stalled import hold_lock
from strategies import RUNTIME_JSON, RUNTIME_TEXT

from blade_runtime.core.store import (
    ActionAlreadyResolved,
    ActionRecord,
    BadCursor,
    CallRecord,
    Claim,
    DataRecord,
    EffectRecord,
    Event,
    FileRecord,
    LeaseLost,
    Pruned,
    Resolution,
    Store,
    StoreError,
    StoreUnavailable,
    TriggerRecord,
    UnknownAction,
    clock,
    dump_json,
    load_json,
    now,
    patience,
)
from blade_runtime.stores.sqlite import SQLiteStore
from blade_runtime.stores.urls import open_store

KINDS = ("memory", "sqlite", "postgres")
DURABLE = ("sqlite", "postgres")


@dataclass
class Backend:
    """One store engine under test: ``open()`` gives another handle on the same data (a new
    connection, as another worker would have; for memory, the one instance)."""

    kind: str
    url: str
    opened: list[Store] = field(default_factory=list)

    @property
    def durable(self) -> bool:
        return self.kind != "memory"

    def open(self) -> Store:
        if self.kind == "memory" and self.opened:
            return self.opened[0]
        store = open_store(self.url)
        self.opened.append(store)
        return store

    def shared(self) -> Store:
        """The first handle opened (one for every example of a property test)."""
        return self.opened[0] if self.opened else self.open()

    def close(self) -> None:
        for store in self.opened:
            store.close()


def _backend(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if kind == "memory":
        url = "memory:"
    elif kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    backend = Backend(kind, url)
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture(params=KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from _backend(request.param, request, tmp_path)


@pytest.fixture(params=DURABLE)
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    yield from _backend(request.param, request, tmp_path)


@pytest.fixture
def store(backend: Backend) -> Store:
    return backend.open()


# -- records -------------------------------------------------------------------------------------


# -- round trips ---------------------------------------------------------------------------------


def test_a_call_suspends_resolves_is_claimed_and_settles(backend: Backend, store: Store) -> None:
    call = a_call(tenant="acme")
    call.lease_until = store.begin(call, ev(call, "started")).lease_until
    assert store.call(call.call_id) == call

    action = an_action(call)
    held = call.claim
    call.state = "suspended"
    store.suspend(call, action, ev(call, "suspended"), claim=held)
    assert store.call(call.call_id) == call
    assert store.action(action.action_id) == action
    assert store.actions() == [action]

    resolved = store.resolve(action.action_id, submitted(), ev(call, "resumed"))
    assert resolved.action.state == "submitted"
    assert resolved.action.resume == {"ok": True}
    assert resolved.call_input == {"amount": 10}
    assert resolved.call_context == {"principal": "alice"}
    assert store.actions() == []
    assert store.actions(state="submitted") == [resolved.action]
    stored = store.call(call.call_id)
    assert stored is not None and stored.state == "resumable" and stored.owner == "w1"

    before = clock()
    [claimed] = store.claim("w2", 7.0)
    assert (claimed.was, claimed.previous_owner) == ("resumable", "w1")
    assert claimed.call.state == "running" and claimed.call.owner == "w2"
    assert before + 7.0 <= claimed.call.lease_until <= clock() + 7.0
    assert store.call(call.call_id) == claimed.call

    store.settle(claimed.call.claim, {"refunded": 10}, ev(call, "result"))
    stored = store.call(call.call_id)
    assert stored is not None and stored.state == "settled" and stored.result == {"refunded": 10}
    assert stored.settled_at is not None and before <= stored.settled_at <= clock()

    events = store.events("run-1")
    assert [e.kind for e in events] == ["started", "suspended", "resumed", "claimed", "result"]
    assert [e.seq for e in events] == sorted({e.seq for e in events})
    assert events[3].payload == {"was": "resumable", "previous_owner": "w1"}
    assert events[3] == claimed.event
    assert {(e.tenant, e.principal) for e in events} == {("acme", "")}
    assert store.head() == events[-1].seq
    assert store.events("run-1", after=events[1].seq) == events[2:]
    assert store.events("another-run") == []


def test_a_store_returns_each_event_numbered_and_never_changes_the_one_it_was_given(
    store: Store,
) -> None:
    call = a_call()
    started = ev(call, "started")
    begun_ = store.begin(call, started)
    finished = ev(call, "result")
    settled = store.settle(call.claim, 1, finished)
    assert started.seq == finished.seq == 0  # the caller's events, as they were
    assert 0 < begun_.event.seq < settled.seq == store.head()
    assert (begun_.event.kind, settled.kind) == ("started", "result")
    assert store.events(call.run_id) == [begun_.event, settled]


def test_a_client_call_is_recorded_with_its_action_when_it_suspends(store: Store) -> None:
    call = a_call(state="pending")
    action = an_action(call)
    action.point = None
    store.suspend(call, action, ev(call, "pending"))
    assert store.call(call.call_id) == call
    assert store.action(action.action_id) == action
    resolved = store.resolve(
        action.action_id,
        Resolution("submitted", now(), resume={"out": 1}, call_state="settled", call_result=5),
        ev(call, "result"),
    )
    assert resolved.action.state == "submitted"
    stored = store.call(call.call_id)
    assert stored is not None and (stored.state, stored.result) == ("settled", 5)


def test_a_resolution_may_hand_the_call_to_a_runtime_under_a_lease(store: Store) -> None:
    call, action = suspended(store)
    before = clock()
    store.resolve(
        action.action_id,
        submitted(call_state="running", call_owner="w9", lease_s=4.0, call_entry={"e": 1}),
        ev(call, "resumed"),
    )
    stored = store.call(call.call_id)
    assert stored is not None
    assert (stored.state, stored.owner, stored.entry) == ("running", "w9", {"e": 1})
    assert before + 4.0 <= stored.lease_until <= clock() + 4.0
    assert stored.fence == call.fence + 1  # a re-entry is a claim of its own
    store.settle(stored.claim, None, ev(call, "result"))


def test_data_items_update_in_place_and_keep_their_order(backend: Backend, store: Store) -> None:
    call = begun(store)
    for item, value in (("b", 1), ("a", 2), ("b", 3)):
        store.write_data(DataRecord(call.call_id, "rows", item, value, now()), ev(call, "data"))
    store.write_data(DataRecord(call.call_id, "other", "x", None, now()), None)
    assert [(d.item_id, d.value) for d in store.data(call.call_id, "rows")] == [("b", 3), ("a", 2)]
    assert [d.channel for d in store.data(call.call_id)] == ["rows", "rows", "other"]
    assert store.data("no-such-call") == []
    assert kinds(store) == ["started", "data", "data", "data"]


def test_an_identifier_with_a_nul_is_kept_or_refused_whole(backend: Backend, store: Store) -> None:
    """A NUL in a caller's identifier: SQLite and memory keep it as it is; PostgreSQL's text
    cannot hold one, so the operation is a StoreError (not a driver's exception), and nothing
    is written."""
    call = a_call(f"call\0{uid('nul')}", tenant="acme\0")
    if backend.kind == "postgres":
        with pytest.raises(StoreError, match="NUL"):
            store.begin(call, ev(call, "started"))
        assert store.call(call.call_id.replace("\0", "")) is None and store.head() == 0
    else:
        call.lease_until = store.begin(call, ev(call, "started")).lease_until
        assert store.call(call.call_id) == call
        assert [c.call_id for c in store.calls(tenant="acme\0")] == [call.call_id]


def test_a_lookup_by_an_id_no_store_could_hold_finds_nothing(store: Store) -> None:
    """Ids from outside (a submit's action id, a client's call id) may hold a lone surrogate,
    or a NUL PostgreSQL's text cannot hold: such a lookup finds nothing on every store, as on
    MemoryStore, instead of raising the driver's encoding error."""
    call = a_call(uid("kept"))
    store.begin(call, ev(call, "started"))
    for hostile in ("act_\udc80", "call_\ud800x", "a\udfff\ud800"):
        assert store.call(hostile) is None and store.action(hostile) is None
    if not isinstance(store, SQLiteStore):  # SQLite holds a NUL (the test above)
        assert store.call("x\0y") is None and store.action("x\0y") is None


def test_a_value_too_large_to_index_is_a_store_error_not_an_outage(
    backend: Backend, store: Store
) -> None:
    """PostgreSQL indexes at most 2,704 bytes an entry: a longer call id is refused as the
    value it is (StoreError), never as the server being unavailable (retrying cannot help)."""
    call = a_call(secrets.token_urlsafe(3000))  # 4,000 characters that do not compress
    if backend.kind == "postgres":
        with pytest.raises(StoreError) as refused:
            store.begin(call, ev(call, "started"))
        assert not isinstance(refused.value, StoreUnavailable)
        assert "index" in str(refused.value)
    else:
        call.lease_until = store.begin(call, ev(call, "started")).lease_until
        assert store.call(call.call_id) == call


# -- ownership ------------------------------------------------------------------------------------


def test_a_call_id_is_recorded_once(backend: Backend, store: Store) -> None:
    call = begun(store)
    head = store.head()
    again = a_call(call.call_id, owner="w2")
    with pytest.raises(StoreError, match="already recorded"):
        store.begin(again, ev(again, "started"))
    assert store.call(call.call_id) == call
    assert store.head() == head  # the failed transaction appended no event


def test_only_the_owner_of_a_running_call_suspends_or_settles_it(
    backend: Backend, store: Store
) -> None:
    call = begun(store, owner="w1")
    head = store.head()
    with pytest.raises(LeaseLost) as lost:
        store.settle(Claim(call.call_id, "w2", call.fence), 1, ev(call, "result"))
    assert (lost.value.call_id, lost.value.owner) == (call.call_id, "w2")
    with pytest.raises(LeaseLost):  # its owner, under another claim's fencing token
        store.settle(Claim(call.call_id, "w1", call.fence + 1), 1, ev(call, "result"))
    intruder = a_call(call.call_id, owner="w2", state="suspended")
    action = an_action(intruder)
    with pytest.raises(LeaseLost):
        store.suspend(intruder, action, ev(call, "suspended"), claim=intruder.claim)
    assert store.call(call.call_id) == call
    assert store.action(action.action_id) is None
    assert store.head() == head

    store.settle(call.claim, 1, ev(call, "result"))
    with pytest.raises(LeaseLost):  # settled: not even its owner settles it again
        store.settle(call.claim, 2, ev(call, "result"))
    stored = store.call(call.call_id)
    assert stored is not None and stored.result == 1


def test_a_call_that_lost_its_lease_is_not_settled_by_its_old_owner(store: Store) -> None:
    call = begun(store, owner="w1", lease_s=-1.0)
    [claimed] = store.claim("w2", 30.0)
    assert claimed.previous_owner == "w1"
    with pytest.raises(LeaseLost):
        store.settle(call.claim, "late", ev(call, "result"))
    store.settle(claimed.call.claim, "mine", ev(call, "result"))
    stored = store.call(call.call_id)
    assert stored is not None and stored.result == "mine"


def test_a_runtime_never_claims_a_call_it_is_running_itself(store: Store) -> None:
    """Its own heartbeat was late (a loaded machine): the lapsed lease is no reason for its own
    sweep to run the call a second time; another runtime still takes it over."""
    call = begun(store, owner="w1", lease_s=-1.0)
    assert store.claim("w1", 30.0, running={call.call_id}) == []
    [mine] = store.claim("w1", 30.0)  # not running there any more (a lost entry): taken up
    assert mine.call.owner == "w1" and mine.call.fence == call.fence + 1
    other = begun(store, owner="w1", lease_s=-1.0)
    [taken] = store.claim("w2", 30.0, running={other.call_id})  # w2 runs no such call
    assert taken.call.call_id == other.call_id and taken.call.owner == "w2"


def test_settling_a_call_never_recorded(store: Store) -> None:
    call = a_call()
    with pytest.raises(LeaseLost):
        store.settle(call.claim, 1, ev(call, "result"))
    assert store.call(call.call_id) is None


def test_after_a_take_over_every_write_of_the_stale_entry_is_refused(store: Store) -> None:
    """Issue 38: what a runner writes carries its claim. Once another worker claimed the call,
    the stale entry's ToolData, file, trigger, suspension and result are each refused with
    LeaseLost and leave nothing (no row, no event); the new owner's are kept. A child's write
    carries its parent entry's claim."""
    call = begun(store, owner="a", lease_s=-1.0)
    stale = call.claim
    [taken] = store.claim("b", 30.0)
    fresh = taken.call.claim
    assert (stale.fence, fresh.fence) == (call.fence, call.fence + 1)
    head = store.head()

    def item(who: str, call_id: str = call.call_id) -> DataRecord:
        return DataRecord(call_id, "log", "log", {"who": who}, now())

    def a_file(who: str) -> FileRecord:
        return FileRecord(uid("file"), "", f"{who}.txt", "text/plain", 1, "0" * 64, now(),
                          call.call_id, call.run_id)  # fmt: skip

    def a_trigger(who: str) -> TriggerRecord:
        return TriggerRecord(uid("trg"), call.call_id, call.run_id, "refund", "", {"who": who},
                             now())  # fmt: skip

    child = f"{call.call_id}/child-1"
    for write in (
        lambda: store.write_data(item("a"), ev(call, "data"), claim=stale),
        lambda: store.write_data(item("a", child), ev(call, "data"), claim=stale),
        lambda: store.save_file(a_file("a"), b"a", claim=stale),
        lambda: store.add_trigger(a_trigger("a"), ev(call, "trigger"), claim=stale),
        lambda: store.suspend(
            replace(call, state="suspended"), an_action(call), ev(call, "suspended"), claim=stale
        ),
        lambda: store.settle(stale, "a's", ev(call, "result")),
    ):
        with pytest.raises(LeaseLost):
            write()
    assert store.head() == head  # no event of theirs either
    assert store.data(call.call_id) == [] and store.data(child) == []
    assert store.triggers() == [] and store.actions(state=None) == []

    kept = store.write_data(item("b"), ev(call, "data"), claim=fresh)
    assert kept is not None and kept.seq > head
    assert store.write_data(item("b", child), None, claim=fresh) is None
    mine = a_file("b")
    store.save_file(mine, b"b", claim=fresh)
    assert store.add_trigger(a_trigger("b"), ev(call, "trigger"), claim=fresh) is not None
    store.settle(fresh, "b's", ev(call, "result"))
    assert [d.value for d in store.data(call.call_id)] == [{"who": "b"}]
    assert [d.value for d in store.data(child)] == [{"who": "b"}]
    assert store.file_content(mine.file_id) == b"b"
    assert [t.input for t in store.triggers()] == [{"who": "b"}]
    stored = store.call(call.call_id)
    assert stored is not None and stored.result == "b's"
    assert [e.kind for e in store.events(call.run_id)][-4:] == [
        "claimed",
        "data",
        "trigger",
        "result",
    ]


# -- resolving exactly once ---------------------------------------------------------------------


def test_an_action_resolves_once(store: Store) -> None:
    call, action = suspended(store)
    with pytest.raises(UnknownAction):
        store.resolve("no-such-action", submitted(), ev(call, "resumed"))
    store.resolve(action.action_id, Resolution("cancelled", now(), reason="no"), ev(call, "x"))
    with pytest.raises(ActionAlreadyResolved) as already:
        store.resolve(action.action_id, submitted(), ev(call, "resumed"))
    assert already.value.action.state == "cancelled"
    assert already.value.action.reason == "no"
    stored = store.action(action.action_id)
    assert stored is not None and stored.resume is None


def test_concurrent_resolutions_from_threads_have_one_winner_each(backend: Backend) -> None:
    stores = [backend.open() for _ in range(4)]
    pairs = [suspended(stores[0]) for _ in range(20)]
    winners: dict[str, list[int]] = {action.action_id: [] for _, action in pairs}
    barrier = threading.Barrier(8)

    def race(worker: int) -> None:
        store = stores[worker % len(stores)]
        barrier.wait()
        for call, action in pairs:
            try:
                store.resolve(action.action_id, submitted(resume={"by": worker}), ev(call, "r"))
            except ActionAlreadyResolved:
                continue
            winners[action.action_id].append(worker)

    threads = [threading.Thread(target=race, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(len(won) == 1 for won in winners.values()), winners
    for _, action in pairs:
        stored = stores[0].action(action.action_id)
        assert stored is not None and stored.resume == {"by": winners[action.action_id][0]}
    assert kinds(stores[0]).count("r") == 20


def _processes(target: Callable[..., None], args: list[tuple[Any, ...]], timeout: float) -> Any:
    """Run ``target(*arg, barrier, queue)`` in one process per ``arg`` (forked.py); their
    results."""
    context = forked.CONTEXT
    barrier = context.Barrier(len(args))
    queue = context.Queue()
    processes = [context.Process(target=target, args=(*arg, barrier, queue)) for arg in args]
    for process in processes:
        process.start()
    try:
        results = [queue.get(timeout=timeout) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    assert [process.exitcode for process in processes] == [0] * len(processes)
    return results


def test_concurrent_resolutions_from_processes_have_one_winner_each(durable: Backend) -> None:
    store = durable.open()
    pairs = [suspended(store) for _ in range(30)]
    actions = [(action.action_id, call.call_id) for call, action in pairs]
    results = _processes(
        store_workers.resolve_all, [(durable.url, worker, actions) for worker in range(4)], 120
    )
    won = [action_id for _, ids in results for action_id in ids]
    assert sorted(won) == sorted(a for a, _ in actions)
    by = {action_id: worker for worker, ids in results for action_id in ids}
    for action_id, _ in actions:
        stored = store.action(action_id)
        assert stored is not None and stored.resume == {"by": by[action_id]}
    assert kinds(store).count("resumed") == 30


def test_memory_store_is_not_shared_with_other_processes() -> None:
    store = open_store("memory:")
    assert store.durable is False  # documented: what another process needs is a durable store
    assert open_store("memory:") is not store


def test_an_expiry_resolves_only_once_the_deadline_has_passed(store: Store) -> None:
    call, later = suspended(store, expires_at=clock() + 60)
    _, never = suspended(store)
    _, past = suspended(store, expires_at=clock() - 1)
    assert [a.action_id for a in store.expired()] == [past.action_id]
    expire = Resolution(
        "expired", now(), reason="timeout", call_state="settled", only_if_expired=True
    )
    for action in (later, never):
        with pytest.raises(ActionAlreadyResolved) as refused:
            store.resolve(action.action_id, expire, ev(call, "result"))
        assert refused.value.action.state == "pending"
    resolved = store.resolve(past.action_id, expire, ev(call, "result"))
    assert resolved.action.state == "expired"
    assert store.expired() == []
    with pytest.raises(ActionAlreadyResolved) as after:  # a submit after the expiry
        store.resolve(past.action_id, submitted(), ev(call, "resumed"))
    assert after.value.action.state == "expired" and after.value.action.reason == "timeout"
    assert store.resolve(later.action_id, submitted(), ev(call, "resumed")).action.state == (
        "submitted"
    )


# -- claims, leases, owners ----------------------------------------------------------------------


def test_claims_take_only_calls_another_runtime_cannot_finish(backend: Backend) -> None:
    store = backend.open()
    ready = resumable(store, owner="w1")
    lapsed = begun(store, owner="w2", lease_s=-1.0)
    of_the_dead = begun(store, owner="gone", lease_s=60.0)
    live = begun(store, owner="w3", lease_s=60.0)
    waiting, _ = suspended(store, owner="w4", lease_s=-1.0)
    done = begun(store, owner="w5", lease_s=-1.0)
    store.settle(done.claim, 0, ev(done, "result"))

    claims = store.claim("me", 30.0)
    assert {c.call.call_id: (c.was, c.previous_owner) for c in claims} == {
        ready.call_id: ("resumable", "w1"),
        lapsed.call_id: ("running", "w2"),
    }
    assert store.claim("me", 30.0) == []  # now leased to "me"
    [taken] = store.claim("me", 30.0, dead={"gone"})
    assert (taken.call.call_id, taken.was, taken.previous_owner) == (
        of_the_dead.call_id,
        "running",
        "gone",
    )
    for call_id, state in ((live.call_id, "running"), (waiting.call_id, "suspended")):
        stored = store.call(call_id)
        assert stored is not None and stored.state == state and stored.owner != "me"
    claimed = [e for e in store.events("run-1") if e.kind == "claimed"]
    assert {e.call_id for e in claimed} == {ready.call_id, lapsed.call_id, of_the_dead.call_id}


def test_a_sweep_judges_leases_as_they_were_when_it_began_waiting(store: Store) -> None:
    ready = resumable(store, owner="w1")
    of_the_dead = begun(store, owner="gone", lease_s=60.0)
    long_lapsed = begun(store, owner="w2", lease_s=-20.0)
    just_lapsed = begun(store, owner="w3", lease_s=-1.0)
    # Its earlier reads waited 7 s, past a 60 s lease's patience (6 s): the owners' renewals may
    # have waited as long, so it judges no lapsed lease; resumable calls and the dead's it takes.
    assert patience(60.0) == 6.0 and patience(0.3) == 0.1  # a tenth, and at least 0.1 s
    claims = store.claim("me", 60.0, dead={"gone"}, waited_s=7.0)
    assert {c.call.call_id for c in claims} == {ready.call_id, of_the_dead.call_id}
    # One that waited 4 s judges leases as they were 4 s ago: one lapsed 1 s ago was not yet.
    assert [c.call.call_id for c in store.claim("me", 60.0, waited_s=4.0)] == [long_lapsed.call_id]
    assert [c.call.call_id for c in store.claim("me", 60.0)] == [just_lapsed.call_id]


def test_a_sweep_that_waited_for_a_lock_claims_no_lapsed_lease(durable: Backend) -> None:
    """Another connection holds the store's lock for 1 s, ten times the patience of a 1 s
    lease: the sweep waiting behind it takes the resumable call and leaves the lapsed one
    (its owner's renewal may be queued behind the same lock); the next sweep takes it."""
    store = durable.open()
    ready = resumable(store, owner="w1")
    lapsed = begun(store, owner="w2", lease_s=-20.0)
    held = threading.Event()
    locker = threading.Thread(target=hold_lock, args=(durable.url, 1.0, held))
    locker.start()
    assert held.wait(10)
    try:
        waited = store.claim("me", 1.0)
    finally:
        locker.join()
    assert [c.call.call_id for c in waited] == [ready.call_id]
    assert [c.call.call_id for c in store.claim("me", 1.0)] == [lapsed.call_id]


def test_a_claim_may_name_its_call_and_tools_and_is_bounded(store: Store) -> None:
    calls = [resumable(store) for _ in range(5)]
    assert store.claim("me", 30.0, names={"another-tool"}) == []  # tools it cannot run
    assert store.claim("me", 30.0, names=set()) == []
    [one] = store.claim("me", 30.0, call_id=calls[3].call_id)
    assert one.call.call_id == calls[3].call_id
    assert store.claim("me", 30.0, call_id=calls[3].call_id) == []
    assert len(store.claim("me", 30.0, limit=2)) == 2
    assert len(store.claim("me", 30.0, names={"refund", "another-tool"})) == 2


def test_a_claim_by_name_and_spec_leaves_another_specs_calls(store: Store) -> None:
    """A runtime that registers a new spec under an old name claims none of the old spec's calls
    (issue 29.7): neither a resumable one nor one whose lease lapsed."""
    old = [resumable(store), begun(store, lease_s=-1.0)]
    new = [
        resumable(store, spec_id="acme.refund.v2"),
        begun(store, lease_s=-1.0, spec_id="acme.refund.v2"),
    ]
    assert store.claim("me", 30.0, names={"refund": "acme.refund.v3"}) == []
    taken = store.claim("me", 30.0, names={"refund": "acme.refund.v2", "other": "x.v1"})
    assert {c.call.call_id for c in taken} == {c.call_id for c in new}
    assert {c.call.spec_id for c in taken} == {"acme.refund.v2"}
    for call in old:
        stored = store.call(call.call_id)
        assert stored is not None and stored.owner != "me"
    assert store.claim("me", 30.0, names={}) == []
    assert {c.call.call_id for c in store.claim("me", 30.0, names={"refund"})} == {
        c.call_id for c in old
    }


def test_concurrent_sweeps_from_threads_never_share_a_call(backend: Backend) -> None:
    stores = [backend.open() for _ in range(4)]
    expected = {resumable(stores[0]).call_id for _ in range(30)}
    expected |= {begun(stores[0], lease_s=-1.0).call_id for _ in range(30)}
    claimed: list[list[str]] = [[] for _ in stores]
    barrier = threading.Barrier(len(stores))

    def sweep(worker: int) -> None:
        barrier.wait()
        while got := stores[worker].claim(f"worker-{worker}", 30.0, limit=3):
            claimed[worker] += [c.call.call_id for c in got]

    threads = [threading.Thread(target=sweep, args=(w,)) for w in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [call_id for ids in claimed for call_id in ids]
    assert sorted(every) == sorted(expected)
    for worker, ids in enumerate(claimed):
        for call_id in ids:
            stored = stores[0].call(call_id)
            assert stored is not None and stored.owner == f"worker-{worker}"


def test_concurrent_sweeps_from_processes_never_share_a_call(durable: Backend) -> None:
    store = durable.open()
    expected = {resumable(store).call_id for _ in range(40)}
    expected |= {begun(store, lease_s=-1.0).call_id for _ in range(20)}
    results = _processes(store_workers.sweep, [(durable.url, w) for w in range(4)], 120)
    every = [call_id for _, ids in results for call_id in ids]
    assert sorted(every) == sorted(expected)
    assert kinds(store).count("claimed") == 60


def test_renew_extends_the_leases_an_owner_holds(store: Store) -> None:
    mine = [begun(store, owner="w1", lease_s=1.0) for _ in range(2)]
    parked, _ = suspended(store, owner="w1")
    theirs = begun(store, owner="w2", lease_s=1.0)
    before = clock()
    assert store.renew("w1", 20.0) == {c.call_id for c in mine}
    for call in mine:
        stored = store.call(call.call_id)
        assert stored is not None and stored.lease_until >= before + 20.0
    other = store.call(theirs.call_id)
    assert other is not None and other.lease_until == pytest.approx(theirs.lease_until)
    assert store.renew("nobody", 20.0) == set()
    assert parked.call_id not in store.renew("w1", 20.0)


def test_owners_are_those_of_running_calls_with_live_leases(store: Store) -> None:
    begun(store, owner="live", lease_s=60.0)
    begun(store, owner="lapsed", lease_s=-1.0)
    suspended(store, owner="parked", lease_s=60.0)
    if isinstance(store, SQLiteStore):  # the memory store too: SQLite in memory
        # SQLite names the owners whose runtimes row is not due: one that lately held a running
        # call is among them (each owner named is only checked for liveness).
        assert store.owners() == {"live", "parked"}
    else:
        assert store.owners() == {"live"}


def test_tenants_runs_and_names_filter_calls_and_actions(store: Store) -> None:
    a_call_, a_action = suspended(store, tenant="a", run_id="run-a")
    b_call, b_action = suspended(store, tenant="b", run_id="run-b")
    plain = begun(store, run_id="run-b")
    assert [c.call_id for c in store.calls(tenant="a")] == [a_call_.call_id]
    assert {c.call_id for c in store.calls(run_id="run-b")} == {b_call.call_id, plain.call_id}
    assert [c.call_id for c in store.calls(["running"])] == [plain.call_id]
    assert store.calls(["suspended"], tenant="b", run_id="run-a") == []
    assert len(store.calls()) == 3
    assert [a.action_id for a in store.actions(tenant="b")] == [b_action.action_id]
    assert [a.action_id for a in store.actions(run_id="run-a")] == [a_action.action_id]
    assert [a.action_id for a in store.actions(call_id=b_call.call_id)] == [b_action.action_id]
    assert len(store.actions(name="refund")) == 2 and store.actions(name="other") == []
    store.resolve(a_action.action_id, submitted(), ev(a_call_, "resumed"))
    assert [a.action_id for a in store.actions(state=None, tenant="a")] == [a_action.action_id]
    assert store.actions(tenant="a") == []


def test_concurrent_cycles_and_sweeps_finish_every_call_once(backend: Backend) -> None:
    """Workers run whole cycles (begin, suspend, resolve, claim, settle) while others sweep:
    no deadlock, no error, every call settled once by the worker that claimed it."""
    stores = [backend.open() for _ in range(4)]
    settled: list[str] = []
    errors: list[BaseException] = []

    def cycle(worker: int) -> None:
        store = stores[worker]
        try:
            for _ in range(15):
                call, action = suspended(store, owner=f"w{worker}")
                store.resolve(action.action_id, submitted(), ev(call, "resumed"))
                for claimed in store.claim(f"w{worker}", 30.0, call_id=call.call_id):
                    store.settle(claimed.call.claim, worker, ev(call, "result"))
                    settled.append(claimed.call.call_id)
        except BaseException as error:  # reported below
            errors.append(error)

    def sweep(worker: int) -> None:
        store = stores[worker]
        try:
            for _ in range(60):
                for claimed in store.claim(f"s{worker}", 30.0, limit=2):
                    call = claimed.call
                    store.settle(call.claim, -1, ev(call, "result"))
                    settled.append(call.call_id)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=cycle, args=(w,)) for w in (0, 1)]
    threads += [threading.Thread(target=sweep, args=(w,)) for w in (2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for claimed in stores[0].claim("last", 30.0):  # what the sweeps had not come to
        call = claimed.call
        stores[0].settle(call.claim, 0, ev(call, "result"))
        settled.append(call.call_id)
    assert len(settled) == len(set(settled)) == 30
    assert stores[0].calls(["running", "resumable", "suspended"]) == []


# -- events ----------------------------------------------------------------------------------------


def test_readers_see_events_in_commit_order(durable: Backend) -> None:
    """Writers on their own connections commit concurrently; a reader polling the run's events
    must never find, later, an event numbered below one it has already seen."""
    writers = [durable.open() for _ in range(6)]
    reader = durable.open()
    stop = threading.Event()
    violations: list[tuple[int, int]] = []
    seen_total: list[int] = []

    def write(store: Store) -> None:
        for _ in range(40):
            call = begun(store)
            store.settle(call.claim, None, ev(call, "result"))

    def read() -> None:
        known: set[int] = set()
        highest = 0
        while True:
            last_round = stop.is_set()
            for event in reader.events("run-1"):
                if event.seq not in known:
                    if event.seq < highest:
                        violations.append((event.seq, highest))
                    known.add(event.seq)
            highest = max(known, default=0)
            if last_round:
                seen_total.append(len(known))
                return

    threads = [threading.Thread(target=write, args=(s,)) for s in writers]
    reading = threading.Thread(target=read)
    reading.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    reading.join()
    assert violations == []
    assert seen_total == [6 * 40 * 2]
    assert reader.head() == max(e.seq for e in reader.events("run-1"))


def test_a_failed_transaction_leaves_no_event(durable: Backend) -> None:
    store = durable.open()
    call = begun(store)
    head = store.head()
    for attempt in (
        lambda: store.begin(call, ev(call, "started")),
        lambda: store.settle(Claim(call.call_id, "w2", call.fence), 1, ev(call, "result")),
        lambda: store.resolve("nope", submitted(), ev(call, "resumed")),
    ):
        with pytest.raises(StoreError):
            attempt()
    assert store.head() == head and kinds(store) == ["started"]


def test_changed_waits_for_a_commit_of_another_connection(backend: Backend) -> None:
    reader, writer = backend.open(), backend.open()

    wait_s = 1.0 if backend.kind == "memory" else 5.0

    async def scenario() -> tuple[float, float]:
        reader.events("run-1")
        await asyncio.sleep(0.3)  # a store that listens has begun to
        mark = reader.mark()
        reader.events("run-1")
        started = time.monotonic()
        waiting = asyncio.ensure_future(reader.changed(wait_s, mark))
        await asyncio.sleep(0.2)
        begun(writer)
        await waiting
        woke = time.monotonic() - started
        mark = reader.mark()
        reader.events("run-1")
        started = time.monotonic()
        await reader.changed(0.5, mark)  # nothing committed: the timeout
        return woke, time.monotonic() - started

    woke, idle = asyncio.run(scenario())
    if backend.kind == "postgres":  # NOTIFY: at the commit, and not before it
        assert 0.2 <= woke < 1.5
        assert idle >= 0.45
    elif backend.kind == "sqlite":  # the WAL file's stat, polled: at the commit, not before it
        assert 0.2 <= woke < 1.0
        assert idle >= 0.45
    else:  # documented: nothing outside the process writes, so it waits out the timeout
        assert woke >= 0.95 and idle >= 0.45
    assert kinds(reader) == ["started"]


# -- liveness --------------------------------------------------------------------------------------


def test_memory_liveness_is_unknown() -> None:
    store = open_store("memory:")
    store.attach("w1")
    assert store.alive("w1") is None and store.alive("w2") is None
    store.detach("w1")


# -- bad input -------------------------------------------------------------------------------------


def test_an_unknown_scheme_is_refused_with_the_password_masked() -> None:
    with pytest.raises(StoreUnavailable) as error:
        open_store("redis://user:hunter2@localhost/0")
    message = one_line(error, "hunter2")
    assert message.startswith("redis://user:***@localhost/0") and "unknown store scheme" in message


# -- what goes in comes out ---------------------------------------------------------------------

# JSON as the runtime has it (a lone surrogate cannot be stored by a durable store; see the
# module's doc of each).
_text = RUNTIME_TEXT
_json = RUNTIME_JSON


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(payload=_json, key=_text)
def test_json_values_round_trip(backend: Backend, payload: Any, key: str) -> None:
    store = backend.shared()
    call = a_call(input={key: payload}, run_id=uid("run"))
    call.entry, call.context = payload, {"k": payload}
    call.lease_until = store.begin(call, ev(call, "started", {"p": payload})).lease_until
    action = an_action(call)
    action.payload = payload
    held = call.claim
    call.state = "suspended"
    store.suspend(call, action, ev(call, "suspended"), claim=held)
    assert store.call(call.call_id) == call
    assert store.action(action.action_id) == action
    resolved = store.resolve(action.action_id, submitted(resume=payload), ev(call, "resumed"))
    assert resolved.action.resume == payload and resolved.call_input == {key: payload}
    assert store.events(call.run_id)[0].payload == {"p": payload}


_anything: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text()
    | st.binary(max_size=2)
    | st.sets(st.integers(), max_size=2),
    lambda inner: st.lists(inner, max_size=4)
    | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=3) | st.integers() | st.booleans() | st.none(), inner),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None)
@given(value=_anything)
def test_the_stores_json_is_json_dumps_exactly(value: Any) -> None:
    """The stores' encoder (json's C encoder, made once) writes what json.dumps writes with the
    stores' settings, and refuses what it refuses: NaN and infinities, values without a JSON
    form (bytes, sets), and any lone surrogate is an ASCII escape."""
    try:
        expected: str | type[Exception] = json.dumps(
            value, separators=(",", ":"), ensure_ascii=True, allow_nan=False
        )
    except (ValueError, TypeError) as error:
        expected = type(error)
    if isinstance(expected, str):
        assert dump_json(value) == expected
    else:
        with pytest.raises(expected):
            dump_json(value)


def _json_form(value: Any) -> bool:
    try:
        dump_json(value)
    except (ValueError, TypeError):
        return False
    return True


@settings(max_examples=500, deadline=None)
@given(
    text=st.one_of(
        _anything.map(lambda value: dump_json(value) if _json_form(value) else "[]"),
        _anything.map(lambda value: json.dumps(value, indent=1) if _json_form(value) else " 1"),
        st.text(max_size=12),
        st.text(alphabet=' \t\n[]{}",:0123456789.eE-+truefalsn\\u', max_size=12),
    )
)
def test_the_stores_json_is_read_as_json_loads_reads_it(text: str) -> None:
    """What the stores read is what json.loads reads, and a text it refuses is refused alike."""
    try:
        expected = json.loads(text)
    except json.JSONDecodeError:
        with pytest.raises(json.JSONDecodeError):
            load_json(text)
        return
    assert repr(load_json(text)) == repr(expected)  # repr: NaN equals itself there


def test_a_lone_surrogate_round_trips_through_every_store(store: Store) -> None:
    """Python strings that are not valid Unicode (a lone surrogate) are stored as JSON escapes."""
    call = CallRecord(
        "c-sur",
        "r",
        "tool",
        "t.tool.v1",
        "pure",
        "backend",
        {"q": "a\ud800b"},
        "running",
        now(),
        "me",
        lease_until=clock() + 5,
    )
    store.begin(call, Event("r", "c-sur", "started", {"note": "\udfff"}, now()))
    stored = store.call("c-sur")
    assert stored is not None and stored.input == {"q": "a\ud800b"}
    assert [e.payload for e in store.events("r")] == [{"note": "\udfff"}]


# -- a year of traffic: pages and retention -------------------------------------------------------


def _pending(store: Store, tenant: str, principal: str = "") -> ActionRecord:
    """A suspended call of ``tenant`` made for ``principal`` ("" for nobody), and its action."""
    call = a_call(tenant=tenant, run_id=uid("run"))
    call.principal = principal
    call.lease_until = store.begin(call, ev(call, "started")).lease_until
    action = an_action(call)
    action.principal = principal
    held = call.claim
    call.state = "suspended"
    store.suspend(call, action, ev(call, "suspended"), claim=held)
    return action


def _all_pages(
    read: Callable[..., list[Any]], size: int, between: Callable[[int], None]
) -> list[str]:
    """The ids of every page of ``read`` (``limit``/``after``), ``between(n)`` after page n."""
    seen: list[str] = []
    after: str | None = None
    for page in itertools.count():
        found = read(limit=size + 1, after=after)
        seen += [a.action_id for a in found[:size]]
        if len(found) <= size:
            return seen
        after = found[size - 1].action_id
        between(page)
    raise AssertionError("unreachable")


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(size=st.integers(1, 7), added=st.integers(0, 3), settled=st.integers(0, 3))
def test_pages_cover_every_record_once_while_records_are_added_and_settled(
    backend: Backend, size: int, added: int, settled: int
) -> None:
    """Keyset pages: every action waiting when the listing began and still waiting when its
    page is read is on exactly one page, one added meanwhile is on a later page, one settled
    before its page is on none; another tenant's never, on any page."""
    store = backend.shared()
    tenant, other = uid("tenant"), uid("tenant")
    waiting = [_pending(store, tenant) for _ in range(12)]
    theirs = [_pending(store, other) for _ in range(3)]
    late: list[ActionRecord] = []
    gone: set[str] = set()
    seen_so_far: list[str] = []

    def between(page: int) -> None:
        if page >= 3:  # the listing must end: records are added between its first pages only
            return
        for _ in range(added):
            late.append(_pending(store, tenant))
        unseen = [a for a in waiting if a.action_id not in seen_so_far and a.action_id not in gone]
        for action in unseen[-settled:] if settled else []:
            store.resolve(action.action_id, submitted(), ev(a_call(), "resumed"))
            gone.add(action.action_id)

    def read(**page: Any) -> list[ActionRecord]:
        found = store.actions(tenant=tenant, **page)
        seen_so_far.extend(a.action_id for a in found)
        return found

    listed = _all_pages(read, size, between)
    assert len(listed) == len(set(listed))  # no record twice
    expected = [a.action_id for a in waiting if a.action_id not in gone]
    expected += [a.action_id for a in late]
    assert listed == expected  # each waiting one once, in order; the settled ones on none
    assert not {a.action_id for a in theirs} & set(listed)
    operator = _all_pages(lambda **page: store.actions(**page), size, lambda _: None)
    assert set(listed) <= set(operator) and {a.action_id for a in theirs} <= set(operator)


def test_a_cursor_opens_no_page_for_whoever_could_not_see_its_record(store: Store) -> None:
    """A page starts after the record its cursor names, found with the same tenant and principal
    filters: another tenant's (or, within a tenant, another principal's) record is no place to
    start from, and says nothing of where it sits."""
    alice = _pending(store, "acme", "alice")
    _pending(store, "acme", "bob")
    other = _pending(store, "globex")
    mine = store.actions(tenant="acme", principal="alice", limit=5, after=alice.action_id)
    assert mine == []
    for tenant, principal, cursor in (
        ("acme", "alice", other.action_id),  # another tenant's
        ("globex", None, alice.action_id),
        ("acme", "bob", alice.action_id),  # within the tenant, another principal's
        ("acme", "alice", "no-such-action"),
    ):
        with pytest.raises(BadCursor):
            store.actions(tenant=tenant, principal=principal, after=cursor)
    assert store.actions(after=other.action_id) == []  # an operator's: any record


def test_listings_are_narrowed_to_a_principal_in_the_query(store: Store) -> None:
    anyone = _pending(store, "acme")
    alice = _pending(store, "acme", "alice")
    _pending(store, "acme", "bob")
    ids = {a.action_id for a in store.actions(tenant="acme", principal="alice")}
    assert ids == {anyone.action_id, alice.action_id}
    calls = store.calls(tenant="acme", principal="alice")
    assert {c.call_id for c in calls} == {anyone.call_id, alice.call_id}
    events = store.events(alice.run_id, tenant="acme", principal="alice")
    assert [e.kind for e in events] == ["started", "suspended"]
    assert store.events(alice.run_id, tenant="acme", principal="bob") == []
    assert store.events(alice.run_id, tenant="globex") == []
    assert len(store.events(alice.run_id, limit=1)) == 1


def test_prune_deletes_old_settled_calls_with_everything_of_theirs_and_nothing_else(
    store: Store,
) -> None:
    """Settled history past the policy goes with its actions, ToolData (its children's too),
    events, files and triggers; running, resumable, suspended and pending calls stay however
    old, and so does what the policy keeps; a dry run counts and deletes nothing."""

    def settled_call(**fields: Any) -> CallRecord:
        call, action = suspended(store, **fields)
        resolved = store.resolve(
            action.action_id,
            submitted(call_state="running", call_owner=call.owner),
            ev(call, "resumed"),
        )
        claim = Claim(call.call_id, call.owner, resolved.call_fence)
        store.write_data(
            DataRecord(call.call_id, "log", "a", 1, now()), ev(call, "data"), claim=claim
        )
        child = DataRecord(f"{call.call_id}/step/1", "log", "b", 2, now())
        store.write_data(child, None, claim=claim)
        kept = FileRecord(
            file_id=uid("file"),
            tenant="",
            name="f.txt",
            media_type="text/plain",
            size=3,
            sha256="0" * 64,
            created_at=now(),
            call_id=call.call_id,
            run_id=call.run_id,
        )
        store.save_file(kept, b"abc", claim=claim)
        trigger = TriggerRecord(uid("trg"), call.call_id, call.run_id, "refund", "", {}, now())
        store.add_trigger(trigger, ev(call, "trigger"), claim=claim)
        effect = EffectRecord(uid("eff"), call.run_id, call.call_id, "", "", "message", "hi", now())
        store.add_effect(effect, ev(call, "effect"), claim=claim)
        store.settle(claim, {"done": True}, ev(call, "result"))
        return call

    old = [settled_call(run_id=uid("run")) for _ in range(3)]
    time.sleep(0.05)
    cutoff = clock()
    time.sleep(0.05)
    new = [settled_call(run_id=uid("run")) for _ in range(2)]
    running = begun(store, lease_s=-100.0)  # lapsed long ago: still not history
    waiting, _ = suspended(store)
    resumable_ = resumable(store)
    client = a_call(state="pending")
    store.suspend(client, an_action(client), ev(client, "pending"))
    living = [running, waiting, resumable_, client]

    assert store.prune() == Pruned()  # no policy: nothing
    counted = store.prune(settled_before=cutoff, dry_run=True)
    assert counted.calls == 3 and counted.actions == 3 and counted.data == 6
    assert counted.events == 3 * 7 and counted.files == 3 and counted.triggers == 3
    assert counted.effects == 3
    assert counted.bytes >= 3 * 3  # the files' bytes at least
    assert all(store.call(c.call_id) is not None for c in old)  # a dry run deletes nothing

    assert store.prune(settled_before=cutoff, limit=2).calls == 2  # oldest first, in batches
    last = store.prune(settled_before=cutoff, limit=2)
    assert (
        last.calls,
        last.actions,
        last.data,
        last.events,
        last.files,
        last.triggers,
        last.effects,
    ) == (1, 1, 2, 7, 1, 1, 1)
    for call in old:
        assert store.call(call.call_id) is None
        assert store.actions(state=None, call_id=call.call_id) == []
        assert store.data(call.call_id) == [] and store.data(f"{call.call_id}/step/1") == []
        assert store.events(call.run_id) == [] and store.triggers(run_id=call.run_id) == []
    for call in [*new, *living]:
        assert store.call(call.call_id) is not None
    assert [d.value for d in store.data(new[0].call_id)] == [1]
    assert len(store.events(new[0].run_id)) == 7
    assert [e.kind for e in store.effects(new[0].run_id, tenant="", principal="")] == ["message"]
    assert store.effects(old[0].run_id, tenant="", principal="") == []

    assert store.prune(keep=1).calls == 1  # of the two newer settled calls, the newest stays
    assert store.call(new[0].call_id) is None and store.call(new[1].call_id) is not None
    assert store.prune(keep=0, settled_before=0.0).calls == 1
    for call in living:  # never work that may still need a runtime
        assert store.call(call.call_id) is not None
