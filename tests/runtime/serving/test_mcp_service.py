"""``blade-runtime mcp`` as a service (issue 49), over real stdio and HTTP processes, what ran
counted from outside (``$BLADE_EFFECTS``, the store): recovery, signals, JSON-RPC answers, one
request per id, bounds."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from blade_runtime.stores.sqlite import SQLiteStore

TESTS = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(TESTS))
import agent_tools  # noqa: E402

BIN = Path(sys.executable).parent
META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agent_tools.built_package(tmp_path_factory)


def _env(built: Path, effects: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(built), str(TESTS), env.get("PYTHONPATH", "")])
    env["BLADE_EFFECTS"] = str(effects)
    return env


def call(request_id: Any, name: str, arguments: Any, **meta: Any) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments, "_meta": {**META, **meta}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def line(message: Any) -> bytes:
    return json.dumps(message).encode() + b"\n"


def rss_kib(pid: int) -> int:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1])
    raise AssertionError("no VmRSS")


def effects_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


class Stdio:
    """``blade-runtime mcp`` with raw pipes: lines in, JSON lines out (read by a thread)."""

    def __init__(self, built: Path, tmp: Path, *args: str) -> None:
        self.db, self.effects = tmp / "blade.db", tmp / "effects"
        self.process = subprocess.Popen(
            [
                str(BIN / "blade-runtime"),
                "mcp",
                "agent_tools:make_service_runtime",
                "--store",
                str(self.db),
                "--principal",
                "ann@acme",
                *args,
            ],
            env=_env(built, self.effects),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)

    def start_reading(self) -> None:
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            self.answers.put(json.loads(raw))

    def send(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def answer(self, timeout: float = 30) -> dict[str, Any]:
        return self.answers.get(timeout=timeout)

    def wait_for(self, predicate: Any, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "timed out"
            assert self.process.poll() is None, self.stderr()
            time.sleep(0.05)

    def stderr(self) -> str:
        assert self.process.stderr is not None
        return self.process.stderr.read().decode()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)


@contextlib.contextmanager
def stdio(built: Path, tmp: Path, *args: str, reading: bool = True) -> Iterator[Stdio]:
    server = Stdio(built, tmp, *args)
    if reading:
        server.start_reading()
    try:
        yield server
    finally:
        server.close()


def stored_call(db: Path, call_id: str | None = None) -> Any:
    store = SQLiteStore(db)
    try:
        calls = store.calls()
        return calls if call_id is None else store.call(call_id)
    finally:
        store.close()


# -- JSON-RPC as the protocol requires ---------------------------------------------------------


def test_every_malformed_message_gets_its_answer_over_stdio(built: Path, tmp_path: Path) -> None:
    deep: Any = "x"
    for _ in range(200):
        deep = [deep]
    sent = [
        b"{not json\n",
        line([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]),  # a batch
        b"[]\n",
        line({"jsonrpc": "2.0", "id": None, "method": "ping"}),
        line({"jsonrpc": "2.0", "id": 1.5, "method": "ping"}),
        line({"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}),
        line({"jsonrpc": "2.0", "id": True, "method": "ping"}),
        b'{"jsonrpc": "2.0", "id": 3, "method": "ping", "params": NaN}\n',
        b"\xff\xfe\n",  # not UTF-8
        line({"jsonrpc": "1.0", "id": 4, "method": "ping"}),
    ]
    with stdio(built, tmp_path) as server:
        for data in sent:
            server.send(data)
        got = [server.answer() for _ in sent]
        server.send(line(call(5, "charge", {"cents": 1, "note": deep})))
        nested = server.answer()
        server.send(line(call(6, "find", {"customer_id": 1})))
        normal = server.answer()
    codes = [(answer["id"], answer["error"]["code"]) for answer in got]
    assert codes == [
        (None, -32700),
        (None, -32600),
        (None, -32600),
        (None, -32600),
        (None, -32600),
        (None, -32600),
        (None, -32600),
        (None, -32700),
        (None, -32700),
        (4, -32600),
    ]
    assert "batch" in got[1]["error"]["message"]
    # arguments nested 200 deep: answered like any invalid input, and nothing ran
    assert nested["id"] == 5 and nested["result"]["isError"] is True
    assert nested["result"]["structuredContent"]["error"] == "INVALID_INPUT"
    assert effects_of(tmp_path / "effects") == []
    assert normal["id"] == 6 and normal["result"]["structuredContent"]["id"] == 1


def test_a_request_whose_id_is_in_flight_is_refused_and_never_run(
    built: Path, tmp_path: Path
) -> None:
    with stdio(built, tmp_path) as server:
        server.send(line(call(7, "charge", {"cents": 100, "seconds": 1.5})))
        server.wait_for(lambda: effects_of(server.effects))  # the first one is running
        server.send(line(call(7, "charge", {"cents": 200})))
        refused = server.answer()
        done = server.answer()
        server.send(line(call(7, "charge", {"cents": 300})))  # answered: the id is free again
        again = server.answer()
    assert refused["id"] == 7 and refused["error"]["code"] == -32600
    assert "already in flight" in refused["error"]["message"]
    assert done["id"] == 7 and done["result"]["structuredContent"] == {"charged": 100}
    assert again["result"]["structuredContent"] == {"charged": 300}
    lines = effects_of(tmp_path / "effects")
    assert [row.split()[1] for row in lines] == ["100", "300"]  # 200 never ran


def test_an_oversize_line_is_refused_unbuffered_and_the_next_one_served(
    built: Path, tmp_path: Path
) -> None:
    with stdio(built, tmp_path, "--max-message-bytes", str(1 << 20)) as server:
        server.send(line(call(1, "find", {"customer_id": 1})))
        assert server.answer()["id"] == 1
        before = rss_kib(server.process.pid)
        chunk = b"x" * (1 << 20)
        server.send(b'{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": "')
        for _ in range(64):  # 64 MiB of one message, never a newline until the end
            server.send(chunk)
        server.send(b'"}\n')
        refused = server.answer()
        grown = rss_kib(server.process.pid) - before
        server.send(line(call(3, "find", {"customer_id": 3})))
        normal = server.answer()
    assert refused["id"] is None and refused["error"]["code"] == -32600
    assert "larger than 1048576 bytes" in refused["error"]["message"]
    assert grown < 32 * 1024, f"the server grew by {grown} KiB"  # 64 MiB sent
    assert normal["id"] == 3 and normal["result"]["structuredContent"]["id"] == 3


def test_a_client_that_never_reads_leaves_the_server_bounded(built: Path, tmp_path: Path) -> None:
    """40,000 requests sent without reading an answer: past the requests in flight the server
    stops reading, the pipes fill, and it holds no more; every request is answered once the
    client reads."""
    total = 40_000
    warm = {"jsonrpc": "2.0", "id": total + 1, "method": "tools/list", "params": {"_meta": META}}
    with stdio(built, tmp_path, reading=False) as server:
        # The baseline after one call and one listing answered: what the first of each builds
        # once (the SDK's models, the tools' export) is not counted as growth.
        server.send(line(call(0, "find", {"customer_id": 0})) + line(warm))
        time.sleep(3)
        before = rss_kib(server.process.pid)
        payload = b"".join(
            line({"jsonrpc": "2.0", "id": i, "method": "tools/list", "params": {"_meta": META}})
            for i in range(1, total + 1)
        )
        writer = threading.Thread(target=server.send, args=(payload,), daemon=True)
        writer.start()
        time.sleep(8)
        assert writer.is_alive()  # the server stopped reading: the client's writes wait
        grown = rss_kib(server.process.pid) - before
        server.start_reading()
        ids = {server.answer(60)["id"] for _ in range(total + 2)}
        writer.join(60)
    assert grown < 64 * 1024, f"the server grew by {grown} KiB"
    assert ids == set(range(total + 2))


# -- signals, broken pipes, recovery -----------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_call_stops_cleanly_and_settles_the_call(
    built: Path, tmp_path: Path, signum: int
) -> None:
    with stdio(built, tmp_path, "--grace", "1") as server:
        server.send(line(call(1, "charge", {"cents": 5, "seconds": 60})))
        server.wait_for(lambda: effects_of(server.effects))
        server.process.send_signal(signum)
        answer = server.answer()
        code = server.process.wait(timeout=30)
        said = server.stderr()
    assert code == 0, said
    assert "Traceback" not in said
    result = answer["result"]["structuredContent"]
    assert result["error"] == "CANCELLED"
    assert "after its implementation started: the MCP server is stopping" in result["message"]
    (record,) = stored_call(server.db)
    assert record.state == "settled" and record.result["code"] == "CANCELLED"
    assert "after its implementation started" in record.result["message"]
    assert len(effects_of(server.effects)) == 1


def test_a_broken_pipe_is_a_one_line_exit(built: Path, tmp_path: Path) -> None:
    with stdio(built, tmp_path, reading=False) as server:
        server.send(line(call(1, "charge", {"cents": 5, "seconds": 1})))
        server.wait_for(lambda: effects_of(server.effects))
        assert server.process.stdout is not None
        server.process.stdout.close()  # the client's read end: the answer has nowhere to go
        code = server.process.wait(timeout=30)
        said = server.stderr().strip().splitlines()
    assert code == 0
    assert len(said) == 1 and "broken pipe" in said[0], said


def test_a_client_cancellation_reaches_the_record_with_its_reason(
    built: Path, tmp_path: Path
) -> None:
    with stdio(built, tmp_path) as server:
        server.send(line(call(9, "charge", {"cents": 5, "seconds": 60})))
        server.wait_for(lambda: effects_of(server.effects))
        cancel = {"requestId": 9, "reason": "the user pressed stop"}
        server.send(line({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel}))
        server.wait_for(lambda: stored_call(server.db)[0].state == "settled")
        server.send(line(call(10, "find", {"customer_id": 1})))
        after = server.answer()
        server.send(line(call(9, "find", {"customer_id": 9})))  # its id is free again
        reused = server.answer()
    assert after["id"] == 10  # the cancelled request is never answered (the protocol says so)
    assert reused["id"] == 9 and reused["result"]["structuredContent"]["id"] == 9
    record = stored_call(server.db)[0]
    assert record.result["code"] == "CANCELLED"
    assert record.result["message"] == (
        "The tool call was cancelled after its implementation started: the MCP client "
        "cancelled its request, saying 'the user pressed stop'."
    )


def _pending_submit(built: Path, tmp: Path, action_id: str, answer: Any) -> str:
    done = subprocess.run(
        [
            str(BIN / "blade-runtime"),
            "pending",
            "submit",
            action_id,
            json.dumps(answer),
            "--store",
            str(tmp / "blade.db"),
        ],
        env=_env(built, tmp / "effects"),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_an_answer_from_the_cli_is_resumed_by_the_running_stdio_server(
    built: Path, tmp_path: Path
) -> None:
    with stdio(built, tmp_path) as server:
        # no elicitation capability: the call's answer is its pending action
        server.send(line(call(1, "transfer", {"to": "bob", "amount": 5})))
        result = server.answer()["result"]
        action = json.loads(result["content"][0]["text"])["action_id"]
        _pending_submit(built, tmp_path, action, {"approved": True, "approver": "cli"})
        server.wait_for(lambda: stored_call(server.db)[0].state == "settled", timeout=20)
        assert server.process.poll() is None
    (record,) = stored_call(server.db)
    assert record.result["content"] == {"status": "sent", "by": "cli"}
    lines = effects_of(tmp_path / "effects")
    assert len(lines) == 1 and f"pid {server.process.pid}" in lines[0]  # resumed there


# -- over HTTP ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Http:
    def __init__(self, built: Path, tmp: Path, *args: str) -> None:
        self.db, self.effects = tmp / "blade.db", tmp / "effects"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process = subprocess.Popen(
            [
                str(BIN / "blade-runtime"),
                "mcp",
                "agent_tools:make_service_runtime",
                "--store",
                str(self.db),
                "--principal",
                "ann@acme",
                "--http",
                f"127.0.0.1:{self.port}",
                *args,
            ],
            env=_env(built, self.effects),
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stderr is not None
        said = self.process.stderr.readline()
        assert "serving" in said, said + self.process.stderr.read()

    def post(self, message: Any, timeout: float = 30) -> Any:
        import httpx

        headers = {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2026-07-28",
            "mcp-method": str(message["method"]),
        }
        if message["method"] == "tools/call":
            headers["mcp-name"] = message["params"]["name"]
        response = httpx.post(self.url, json=message, headers=headers, timeout=timeout)
        return response.json()


@contextlib.contextmanager
def http(built: Path, tmp: Path, *args: str) -> Iterator[Http]:
    server = Http(built, tmp, *args)
    try:
        yield server
    finally:
        if server.process.poll() is None:
            server.process.kill()
        server.process.wait(timeout=30)


def test_half_sent_http_requests_are_timed_out_and_a_normal_call_is_served(
    built: Path, tmp_path: Path
) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    opened: list[socket.socket] = []
    with http(built, tmp_path, "--request-timeout", "2", "--max-connections", "256") as server:
        try:
            for _ in range(1030):
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
                sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                opened.append(sock)
            deadline = time.monotonic() + 30
            while True:  # served once the half-sent requests time out (2 s)
                try:
                    answer = server.post(call(1, "find", {"customer_id": 4}), timeout=5)
                    break
                except Exception:
                    assert time.monotonic() < deadline
                    time.sleep(0.5)
            closed = 0
            for sock in opened:
                sock.settimeout(10)
                try:
                    closed += sock.recv(1) == b""
                except OSError:  # reset: closed too
                    closed += 1
        finally:
            for sock in opened:
                sock.close()
        assert server.process.poll() is None
    assert answer["result"]["structuredContent"] == {"id": 4, "name": "customer 4"}
    assert closed == len(opened)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_call_over_http_stops_cleanly_and_settles_the_call(
    built: Path, tmp_path: Path, signum: int
) -> None:
    answers: list[Any] = []
    with http(built, tmp_path, "--grace", "1") as server:
        asking = threading.Thread(
            target=lambda: answers.append(
                server.post(call(1, "charge", {"cents": 5, "seconds": 60}), timeout=60)
            )
        )
        asking.start()
        deadline = time.monotonic() + 30
        while not effects_of(server.effects):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        server.process.send_signal(signum)
        code = server.process.wait(timeout=30)
        asking.join(30)
        assert server.process.stderr is not None
        said = server.process.stderr.read()
    assert code == 0 and "Traceback" not in said, said
    result = answers[0]["result"]["structuredContent"]
    assert result["error"] == "CANCELLED" and "the MCP server is stopping" in result["message"]
    (record,) = stored_call(server.db)
    assert record.state == "settled" and "after its implementation started" in str(record.result)


def test_an_answer_from_the_cli_is_resumed_by_the_running_http_server(
    built: Path, tmp_path: Path
) -> None:
    with http(built, tmp_path) as server:
        pending = server.post(call(1, "transfer", {"to": "bob", "amount": 5}))
        action = json.loads(pending["result"]["content"][0]["text"])["action_id"]
        _pending_submit(built, tmp_path, action, {"approved": True, "approver": "cli"})
        deadline = time.monotonic() + 20
        while stored_call(server.db)[0].state != "settled":
            assert time.monotonic() < deadline
            time.sleep(0.1)
    lines = effects_of(tmp_path / "effects")
    assert len(lines) == 1 and f"pid {server.process.pid}" in lines[0]


# -- progress on every transport (issue 50.1) --------------------------------------------------


def _progress_through(target: Any, mode: str | None) -> tuple[list[Any], Any]:
    import asyncio

    from mcp import Client

    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    async def main() -> Any:
        options = {} if mode is None else {"mode": mode}
        async with Client(target, **options) as client:
            watched = await client.call_tool(
                "charge", {"cents": 3, "steps": 3, "seconds": 0.2}, progress_callback=progress
            )
            unwatched = await client.call_tool("charge", {"cents": 4, "steps": 2})
            return watched, unwatched

    watched, unwatched = asyncio.run(main())
    assert watched.structured_content == {"charged": 3}
    assert unwatched.structured_content == {"charged": 4}
    return seen, watched


EXPECTED_PROGRESS = [
    (1.0, 3.0, "step 1"),
    (2.0, 3.0, "step 2"),
    (3.0, 3.0, "step 3"),
    (3.0, 3.0, "charged"),
]


@pytest.mark.parametrize("mode", [None, "legacy"], ids=["2026-07-28", "legacy"])
def test_progress_reaches_a_stdio_client_that_sent_a_token(
    built: Path, tmp_path: Path, mode: str | None
) -> None:
    from mcp import StdioServerParameters

    params = StdioServerParameters(
        command=str(BIN / "blade-runtime"),
        args=["mcp", "agent_tools:make_service_runtime", "--store", str(tmp_path / "p.db")],
        env=_env(built, tmp_path / "effects"),
    )
    seen, _ = _progress_through(params, mode)
    assert seen == EXPECTED_PROGRESS


@pytest.mark.parametrize("mode", [None, "legacy"], ids=["2026-07-28", "legacy"])
def test_progress_reaches_a_streamable_http_client_that_sent_a_token(
    built: Path, tmp_path: Path, mode: str | None
) -> None:
    with http(built, tmp_path) as server:
        seen, _ = _progress_through(server.url, mode)
    assert seen == EXPECTED_PROGRESS


def test_a_busy_port_is_a_one_line_exit_4_before_anything_is_loaded(
    built: Path, tmp_path: Path
) -> None:
    """``mcp --http`` listens before it loads the runtime: a port in use ends it with exit 4
    and one line naming the address, as ``serve`` does, and the store is never opened."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                str(BIN / "blade-runtime"),
                "mcp",
                "agent_tools:make_service_runtime",
                "--store",
                str(tmp_path / "blade.db"),
                "--http",
                f"127.0.0.1:{port}",
            ],
            env=_env(built, tmp_path / "effects"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 4, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: cannot listen on http://127.0.0.1:{port}: Address already in use"
    ]
    assert not (tmp_path / "blade.db").exists()


def test_a_busy_port_exits_before_the_mcp_sdk_is_imported(built: Path, tmp_path: Path) -> None:
    """What makes the busy port's exit prompt: the MCP SDK (over half a second to import, more
    on a busy machine) is imported only once the server listens, and ``serve``'s one line and
    exit code are given before it (issue 50 item 7: it took 2.5-5.6 s)."""
    probe = (
        "import sys\n"
        "from blade_runtime.serving.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "print(code, sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')))\n"
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = ["mcp", "agent_tools:make_service_runtime", "--store", str(tmp_path / "b.db")]
        done = subprocess.run(
            [sys.executable, "-c", probe, *command, "--http", f"127.0.0.1:{port}"],
            env=_env(built, tmp_path / "effects"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.stdout.split() == ["4", "[]"], done.stdout + done.stderr
    assert "Address already in use" in done.stderr
