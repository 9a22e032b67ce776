"""The HTTP API after a year of traffic, on a real uvicorn on 127.0.0.1: listings a page at a
time (the next page's cursor in the body and a Link header), a cursor that opens nothing for
another principal, streams a principal may not hold without bound, a reader that lags told
where to resume, and streams that end with their client."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
from http_support import ALICE, BOB, CAROL, REFUND, ROOT, authenticate, runtime_of, serving

from blade_runtime.serving.http import create_app
from blade_runtime.stores.sqlite import SQLiteStore


def test_listings_are_pages_with_the_next_one_named(tmp_path: Path, example_package: Any) -> None:
    runtime, _ = runtime_of(SQLiteStore(tmp_path / "pages.db"))
    app = create_app(runtime, authenticate=authenticate)
    with serving(app) as server, httpx.Client(base_url=server.url, timeout=10) as http:
        for who in (ALICE, BOB, ALICE, CAROL, ALICE, ALICE, ALICE):
            asked = http.post("/v1/tools/refund_payment/calls?run_id=r1", json=REFUND, headers=who)
            assert asked.status_code == 202, asked.text
        mine: list[str] = []
        url: str | None = "/v1/actions?limit=2"
        pages = 0
        while url is not None:
            page = http.get(url, headers=ALICE)
            assert page.status_code == 200, page.text
            body = page.json()
            mine += [a["action_id"] for a in body["actions"]]
            assert {a["principal_id"] for a in body["actions"]} <= {"alice"}
            pages += 1
            link = page.headers.get("link")
            if body["next"] is None:
                assert link is None
                url = None
            else:
                assert link is not None and f"cursor={body['next']}" in link
                url = link[1 : link.index(">")]
        assert len(mine) == len(set(mine)) == 5 and pages == 3

        everyone = http.get("/v1/actions?limit=1000", headers=ROOT).json()
        assert len(everyone["actions"]) == 7 and everyone["next"] is None
        first = http.get("/v1/actions?limit=1", headers=ALICE).json()
        for who in (BOB, CAROL):  # a cursor of Alice's opens nothing for another
            refused = http.get(f"/v1/actions?cursor={first['next']}", headers=who)
            assert refused.status_code == 400 and refused.json()["code"] == "BAD_CURSOR"
        for bad in ("limit=0", "limit=ten", "waiting_over=soon"):
            assert http.get(f"/v1/actions?{bad}", headers=ALICE).status_code == 400
        assert http.get("/v1/actions?cursor=%%%", headers=ALICE).status_code == 400
        assert http.get("/v1/actions?waiting_over=3600", headers=ALICE).json()["actions"] == []
        assert len(http.get("/v1/actions?waiting_under=3600", headers=ALICE).json()["actions"]) == 5
        calls = http.get("/v1/runs/r1/calls?limit=3", headers=ALICE).json()
        assert len(calls["calls"]) == 3 and calls["next"] is not None
        assert http.get("/v1/grants?limit=5", headers=ALICE).json() == {"grants": [], "next": None}


def test_a_principal_holds_a_bounded_number_of_streams_and_others_are_served(
    tmp_path: Path, example_package: Any
) -> None:
    """Streams that never read: one principal gets as many as the server allows (429 past it),
    and another tenant's requests are answered meanwhile; each stream is gone once its client
    has gone."""
    runtime, _ = runtime_of(SQLiteStore(tmp_path / "streams.db"))
    app = create_app(runtime, authenticate=authenticate, max_streams_per_principal=3)
    with serving(app) as server:
        setup = httpx.Client(base_url=server.url, timeout=10)
        for who in (ALICE, BOB):
            setup.post("/v1/tools/refund_payment/calls?run_id=s", json=REFUND, headers=who)
        clients = [httpx.Client(base_url=server.url, timeout=10) for _ in range(4)]
        streams = []
        try:
            for client in clients:
                streams.append(client.stream("GET", "/v1/runs/s/events?after=0", headers=ALICE))
            statuses = [stream.__enter__().status_code for stream in streams]
            assert statuses == [200, 200, 200, 429]
            started = time.monotonic()
            for _ in range(10):
                assert setup.get("/v1/tools", headers=BOB).status_code == 200
            assert time.monotonic() - started < 5
        finally:
            for client in clients:
                client.close()
        api = app.state.api
        deadline = time.monotonic() + 10
        while api.streams and time.monotonic() < deadline:
            time.sleep(0.05)
        assert api.streams == {}  # every subscription is gone with its client
        assert not runtime.events.active
        again = httpx.Client(base_url=server.url, timeout=10)
        with again.stream("GET", "/v1/runs/s/events?after=0", headers=ALICE) as stream:
            assert stream.status_code == 200  # its share is back
        again.close()
        setup.close()


def test_a_reader_that_reads_nothing_holds_a_window_and_is_cut_off(
    tmp_path: Path, example_package: Any
) -> None:
    """A client that opens a stream and reads nothing while a run writes megabytes of events:
    the server holds its window of them (not the run's backlog), cuts the connection once a
    write has waited past the write timeout, and the subscription is gone."""
    import socket

    store = SQLiteStore(tmp_path / "cut.db")
    runtime, _ = runtime_of(store)
    app = create_app(
        runtime, authenticate=authenticate, stream_window=4, stream_write_timeout_s=1.0
    )
    api = app.state.api
    with serving(app) as server, httpx.Client(base_url=server.url, timeout=10) as http:
        http.post("/v1/tools/refund_payment/calls?run_id=c", json=REFUND, headers=ALICE)
        host, port = server.url.removeprefix("http://").split(":")
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect((host, int(port)))
        reader.sendall(
            b"GET /v1/runs/c/events?after=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer token-alice\r\n\r\n"
        )
        deadline = time.monotonic() + 10
        while not api.streams and time.monotonic() < deadline:
            time.sleep(0.01)
        big = {**REFUND, "reason": "x" * 200_000}  # each call's events carry 200 KB
        for _ in range(30):
            http.post("/v1/tools/refund_payment/calls?run_id=c", json=big, headers=ALICE)
        held = max((s._queue.qsize() for subs in api.streams.values() for s in subs), default=0)
        assert held <= 4  # the window, not the 60 events of the run's backlog
        deadline = time.monotonic() + 15
        while api.streams and time.monotonic() < deadline:
            time.sleep(0.05)
        assert api.streams == {}  # cut off after the write timeout: gone
        assert http.get("/v1/tools", headers=BOB).status_code == 200
        reader.close()


def test_a_stream_a_whole_window_behind_for_too_long_says_where_to_resume() -> None:
    """The stream's own check, on a subscription a whole window behind since long ago."""
    from blade_runtime.core.caller import Principal
    from blade_runtime.serving.http.app import _stream

    class Behind:
        behind = time.monotonic() - 60
        last_seq = 41

        def __aiter__(self) -> Any:
            return self

        async def __anext__(self) -> Any:
            raise StopAsyncIteration

        def drop(self) -> None:
            pass

    class Api:
        lag_limit_s = 30.0
        ended = False

        def end_stream(self, principal: Any, subscription: Any) -> None:
            self.ended = True

    api = Api()

    async def read() -> list[str]:
        return [chunk async for chunk in _stream(api, Principal("a", "t"), Behind())]  # type: ignore[arg-type]

    chunks = asyncio.run(read())
    assert chunks[-1] == 'event: lagging\ndata: {"resume_after": 41}\n\n'
    assert api.ended
