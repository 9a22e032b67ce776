"""Large results as artifacts (seed 000: "large-result artifact persistence applies to model, not
data"): over ``large_result_bytes``, the model reads a bounded head and a link, the whole result
is a file of the call in its tenant, and the typed output stays whole; on every store, over MCP
(``resources/read``) and over HTTP (``GET /v1/files/{id}``), never for another tenant."""

from __future__ import annotations

import asyncio
import importlib
import json
from typing import Any

import httpx
import pytest
from conftest import build_and_import, spec
from http_support import ALICE, BOB, authenticate

from blade_runtime import CallContext, Principal, Runtime
from blade_runtime.core.results import ErrorCode, ToolError, ToolSuccess
from blade_runtime.core.store import Store

ANN = Principal("alice", "acme")  # the tokens of http_support: alice of acme, bob of globex
BOB_PRINCIPAL = Principal("bob", "globex")
TEXT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
SIZE = {"type": "object", "properties": {"size": {"type": "integer"}}, "required": ["size"]}


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("artifacts")
    build_and_import(
        root,
        "artifact_pkg",
        spec(
            "docs.dump.v1",
            description="Returns a text of the size asked for.",
            inputSchema=SIZE,
            outputSchema=TEXT,
            sideEffect="pure",
        ),
    )
    return importlib.import_module("artifact_pkg.docs.dump_v1")


def implementation(dump: Any) -> Any:
    async def run(ctx: Any) -> Any:
        size = ctx.input.size
        return dump.SPEC.output_type(text=("0123456789" * (size // 10 + 1))[:size])

    return run


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_a_large_result_is_read_by_the_model_as_its_head_and_a_link_on_every_store(
    dump: Any, store: Store
) -> None:
    five_mb = 5 * 1024 * 1024

    async def scenario() -> tuple[Any, Any, Any, Any, Any]:
        runtime = Runtime(store=store, large_result_bytes=64 * 1024)
        runtime.register(dump.SPEC, implementation(dump))
        acme = CallContext(principal=ANN)
        small = await runtime.call("dump", {"size": 100}, call_id="c-small", context=acme)
        large = await runtime.call("dump", {"size": five_mb}, call_id="c-large", context=acme)
        assert isinstance(large, ToolSuccess) and large.artifact is not None
        mine = await runtime.records.file(large.artifact, principal=ANN)
        theirs = await runtime.records.file(large.artifact, principal=BOB_PRINCIPAL)
        await runtime.close()
        return small, large, mine, theirs, store.call("c-large")

    small, large, mine, theirs, record = run(scenario())
    assert isinstance(small, ToolSuccess) and small.artifact is None
    assert small.content == {"text": ("0123456789" * 10)}  # under the limit: as it was
    # The model reads a bounded head, a sentence saying where the rest is, and a link.
    text, link = large.content
    assert text["type"] == "text" and len(text["text"]) < 2500
    assert text["text"].startswith('{"text":"0123456789')
    assert f"blade://files/{large.artifact}" in text["text"]
    assert link == {
        "type": "resource_link",
        "uri": f"blade://files/{large.artifact}",
        "name": "dump-result.json",
        "mimeType": "application/json",
        "description": f"The whole result of call c-large ({five_mb + 11} bytes).",
        "size": five_mb + 11,
    }
    # The typed output is never offloaded; the file holds exactly what the model would have read.
    assert len(large.output.text) == five_mb
    assert json.loads(mine.content) == {"text": large.output.text}
    assert mine.file.media_type == "application/json"
    assert theirs is None  # another tenant: as unknown as a file never saved
    if record is not None:  # a stored call keeps the whole output beside the content
        assert record.result["content"] == large.content
        assert len(record.result["output"]["text"]) == five_mb


def test_a_registration_sets_its_own_limit_over_the_runtimes(dump: Any) -> None:
    async def scenario() -> list[Any]:
        runtime = Runtime()  # no limit of its own
        runtime.register(dump.SPEC, implementation(dump), large_result_bytes=1000)
        runtime.register(dump.SPEC, implementation(dump), name="dump_whole")
        return [
            await runtime.call("dump", {"size": 5000}),
            await runtime.call("dump_whole", {"size": 5000}),
        ]

    limited, whole = run(scenario())
    assert limited.artifact is not None and len(limited.content[0]["text"]) < 1000
    assert whole.artifact is None and whole.content == {"text": whole.output.text}


def test_a_limit_is_a_positive_number_of_bytes(dump: Any) -> None:
    with pytest.raises(
        ValueError,
        match=r"Runtime\(large_result_bytes=\.\.\.\) is a number of bytes above 0, not 0",
    ):
        Runtime(large_result_bytes=0)
    with pytest.raises(ValueError, match=r"registering docs.dump.v1 as 'dump': large_result"):
        Runtime().register(dump.SPEC, implementation(dump), large_result_bytes=-5)


def test_a_large_result_that_cannot_be_kept_is_an_error_not_the_whole_result(dump: Any) -> None:
    async def scenario() -> Any:
        runtime = Runtime(large_result_bytes=1000, max_file_bytes=2000)
        runtime.register(dump.SPEC, implementation(dump))
        return await runtime.call("dump", {"size": 5000})

    result = run(scenario())
    assert isinstance(result, ToolError) and result.code is ErrorCode.STORE_UNAVAILABLE
    assert "could not be kept as a file" in result.message


def test_an_mcp_client_reads_the_link_and_another_tenant_cannot(dump: Any) -> None:
    import mcp_types as types
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    from blade_runtime.serving.mcp import mcp_server

    async def scenario() -> tuple[Any, ...]:
        runtime = Runtime(large_result_bytes=4096)
        runtime.register(dump.SPEC, implementation(dump))
        async with Client(mcp_server(runtime, principal=ANN)) as client:
            listed = (await client.list_tools()).tools
            result = await client.call_tool("dump", {"size": 200_000})
            [_, link] = result.content
            assert isinstance(link, types.ResourceLink)
            read = await client.read_resource(link.uri)
        async with Client(mcp_server(runtime, principal=BOB_PRINCIPAL)) as other:
            with pytest.raises(MCPError) as refused:
                await other.read_resource(link.uri)
        return listed, result, link, read, refused.value

    listed, result, link, read, refused = run(scenario())
    [tool] = listed
    assert tool.output_schema is None  # a head and a link need not be the output's shape
    assert not result.is_error and result.structured_content is None
    assert isinstance(result.content[0], types.TextContent)
    assert len(result.content[0].text) < 2500
    assert link.size == 200_000 + 11 and link.mime_type == "application/json"
    [contents] = read.contents
    assert isinstance(contents, types.TextResourceContents)
    assert json.loads(contents.text)["text"] == ("0123456789" * 20_000)
    assert refused.error.code == -32002 and "Resource not found" in refused.error.message


def test_an_http_client_gets_a_url_its_tenant_alone_reads(dump: Any) -> None:
    from blade_runtime.serving.http import create_app

    async def scenario() -> tuple[Any, ...]:
        runtime = Runtime(large_result_bytes=4096)
        runtime.register(dump.SPEC, implementation(dump))
        app = create_app(runtime, authenticate=authenticate)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            answer = await http.post("/v1/tools/dump/calls", json={"size": 100_000}, headers=ALICE)
            url = answer.json()["artifact"]["url"]
            mine = await http.get(url, headers=ALICE)
            theirs = await http.get(url, headers=BOB)
        await runtime.close()
        return answer, mine, theirs

    answer, mine, theirs = run(scenario())
    body = answer.json()
    assert answer.status_code == 200 and len(body["output"]["text"]) == 100_000
    assert body["content"][1]["uri"] == f"blade://files/{body['artifact']['file_id']}"
    assert mine.status_code == 200
    assert mine.json() == {"text": body["output"]["text"]}
    assert theirs.status_code == 404
