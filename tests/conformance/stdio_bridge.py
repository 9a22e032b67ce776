"""The conformance suite against ``blade-runtime mcp`` over stdio: the suite speaks HTTP only
(``conformance server --url``), so this relay posts each JSON-RPC message it receives to one
stdio server as a line, and answers with what that server writes back for it.

    python stdio_bridge.py PORT -- blade-runtime mcp fixture_tools:make_runtime --store ...

Stateless, as protocol 2026-07-28 is: each POST is one message; a request's id is made unique
on the way in (clients reuse ids) and given back on the way out; the notifications the server
writes while a request runs (progress for its token, log messages) go before its answer as
server-sent events. Nothing of HTTP's own (headers, status codes) is the server's here, so only
the suite's transport-neutral tool scenarios are run through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


class Relay:
    def __init__(self, command: list[str]) -> None:
        self.command = command
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Queue[dict[str, Any]]] = {}
        self.tokens: dict[Any, int] = {}  # a progress token -> the request that sent it
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        asyncio.get_running_loop().create_task(self._read())

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            await self.process.wait()

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        async for raw in self.process.stdout:
            message = json.loads(raw)
            params = message.get("params") or {}
            owner = message.get("id") if "method" not in message else None
            if owner is None and "progressToken" in params:
                owner = self.tokens.get(params["progressToken"])
            if owner is None and len(self.waiting) == 1:  # a log message: the one request's
                owner = next(iter(self.waiting))
            if owner in self.waiting:
                await self.waiting[owner].put(message)

    async def send(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        """What the server writes for ``message``: its notifications, then its answer."""
        assert self.process is not None and self.process.stdin is not None
        if "id" not in message:  # a notification: no answer
            self.process.stdin.write(json.dumps(message).encode() + b"\n")
            return []
        own, theirs = next(self.ids), message["id"]
        token = ((message.get("params") or {}).get("_meta") or {}).get("progressToken")
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.waiting[own] = queue
        if token is not None:
            self.tokens[token] = own
        try:
            self.process.stdin.write(json.dumps({**message, "id": own}).encode() + b"\n")
            written: list[dict[str, Any]] = []
            while True:
                got = await asyncio.wait_for(queue.get(), 30)
                if "method" in got:
                    written.append(got)
                    continue
                written.append({**got, "id": theirs})
                return written
        finally:
            del self.waiting[own]
            self.tokens.pop(token, None)


def app(relay: Relay) -> Starlette:
    async def post(request: Request) -> Response:
        try:
            message = json.loads(await request.body())
        except ValueError:
            return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": -32700}}, 400)
        written = await relay.send(message)
        if not written:
            return Response(status_code=202)
        if len(written) == 1:
            return JSONResponse(written[0])
        events = "".join(f"event: message\ndata: {json.dumps(m)}\n\n" for m in written)
        return Response(events, media_type="text/event-stream")

    async def other(request: Request) -> Response:
        return Response(status_code=405)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await relay.start()
        try:
            yield
        finally:
            await relay.stop()

    return Starlette(
        routes=[Route("/mcp", post, methods=["POST"]), Route("/mcp", other, methods=["GET"])],
        lifespan=lifespan,
    )


def main() -> None:
    port, command = int(sys.argv[1]), sys.argv[sys.argv.index("--") + 1 :]
    uvicorn.run(app(Relay(command)), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
