"""Result metadata (seed 000, ``ToolResult.metadata``): a result, a success or an error, may carry
metadata, JSON for the application that is not written back to the model's context. A tool sets
it with ``ctx.metadata``; it is stored with the call and returned by ``Runtime.call``, HTTP, MCP
(the result's ``_meta``), the typed client and Pydantic AI (``ToolReturn.metadata``)."""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import httpx
import pytest
from conftest import build_and_import, spec
from http_support import ALICE, authenticate

from blade_runtime import CallContext, Principal, Runtime
from blade_runtime.core.results import ErrorCode, ToolError, ToolSuccess
from blade_runtime.core.store import Store

ANN = Principal("alice", "acme")
NAME = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
UPLOAD = {
    "type": "object",
    "properties": {"upload_id": {"type": "string"}},
    "required": ["upload_id"],
}


@pytest.fixture(scope="module")
def upload(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("metadata")
    build_and_import(
        root,
        "metadata_pkg",
        spec(
            "files.upload.v1",
            description="Uploads a file by name.",
            inputSchema=NAME,
            outputSchema=UPLOAD,
            sideEffect="idempotent",
        ),
    )
    importlib.import_module("metadata_pkg.files.upload_v1")
    importlib.import_module("metadata_pkg.client")
    return importlib.import_module("metadata_pkg")


def implementation(upload: Any) -> Any:
    """Uploads, and tells the application (not the model) how: its bytes and its attempt; a name
    "broken" fails after saying how far it got."""
    module = upload.files.upload_v1

    async def run(ctx: Any) -> Any:
        ctx.metadata({"bytes": 1250, "attempt": 1})
        if ctx.input.name == "broken":
            ctx.metadata({"attempt": 2, "stage": "commit"})
            ctx.fail("The upload could not be committed.")
        return module.SPEC.output_type(upload_id=f"upload-{ctx.input.name}")

    return run


def registered(upload: Any, **options: Any) -> Runtime:
    runtime = Runtime(**options)
    runtime.register(upload.files.upload_v1.SPEC, implementation(upload))
    return runtime


def test_a_result_carries_metadata_that_is_not_written_back_to_the_model(
    upload: Any, store: Store
) -> None:
    async def scenario() -> tuple[Any, Any, Any, Any]:
        runtime = registered(upload, store=store)
        acme = CallContext(principal=ANN)
        done = await runtime.call("upload", {"name": "a.txt"}, call_id="c-ok", context=acme)
        failed = await runtime.call("upload", {"name": "broken"}, call_id="c-bad", context=acme)
        await runtime.close()
        return done, failed, store.call("c-ok"), store.call("c-bad")

    done, failed, stored, stored_failure = asyncio.run(scenario())
    assert isinstance(done, ToolSuccess)
    assert done.metadata == {"bytes": 1250, "attempt": 1}
    assert done.content == {"upload_id": "upload-a.txt"}  # the model reads no metadata
    # An error result carries metadata too; later ctx.metadata calls add to it key by key.
    assert isinstance(failed, ToolError) and failed.code is ErrorCode.TOOL_FAILED
    assert failed.metadata == {"bytes": 1250, "attempt": 2, "stage": "commit"}
    assert "attempt" not in str(failed.content)
    if stored is not None:  # a store that keeps calls keeps the metadata with the result
        assert stored.result["metadata"] == {"bytes": 1250, "attempt": 1}
        assert stored.result["content"] == {"upload_id": "upload-a.txt"}
        assert stored_failure.result["metadata"] == failed.metadata


def test_a_result_without_metadata_has_none_anywhere(upload: Any, store: Store) -> None:
    async def plain(ctx: Any) -> Any:
        return upload.files.upload_v1.SPEC.output_type(upload_id="u")

    async def scenario() -> tuple[Any, Any]:
        runtime = Runtime(store=store)
        runtime.register(upload.files.upload_v1.SPEC, plain)
        done = await runtime.call("upload", {"name": "a"}, call_id="c-plain")
        await runtime.close()
        return done, store.call("c-plain")

    done, stored = asyncio.run(scenario())
    assert done.metadata is None
    assert stored is None or "metadata" not in stored.result


def test_metadata_that_is_not_json_fails_the_call_as_the_tools_bug(upload: Any) -> None:
    async def bad(ctx: Any) -> Any:
        ctx.metadata({"when": object()})
        return upload.files.upload_v1.SPEC.output_type(upload_id="u")

    async def scenario() -> Any:
        runtime = Runtime()
        runtime.register(upload.files.upload_v1.SPEC, bad)
        return await runtime.call("upload", {"name": "a"})

    result = asyncio.run(scenario())
    assert isinstance(result, ToolError) and result.code is ErrorCode.TOOL_ERROR
    assert result.metadata is None  # nothing half-set


def test_http_returns_the_metadata_beside_the_output_and_with_an_error(upload: Any) -> None:
    from blade_runtime.serving.http import create_app

    async def scenario() -> tuple[Any, ...]:
        runtime = registered(upload)
        app = create_app(runtime, authenticate=authenticate)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            done = await http.post("/v1/tools/upload/calls", json={"name": "a"}, headers=ALICE)
            again = await http.post(  # a retry is answered from the stored call
                "/v1/tools/upload/calls",
                json={"name": "a"},
                headers={**ALICE, "Idempotency-Key": "k-1"},
            )
            stored = await http.post(
                "/v1/tools/upload/calls",
                json={"name": "a"},
                headers={**ALICE, "Idempotency-Key": "k-1"},
            )
            failed = await http.post(
                "/v1/tools/upload/calls", json={"name": "broken"}, headers=ALICE
            )
            document = (await http.get("/v1/openapi.json", headers=ALICE)).json()
        await runtime.close()
        return done, again, stored, failed, document

    done, again, stored, failed, document = asyncio.run(scenario())
    assert done.status_code == 200
    assert done.json()["metadata"] == {"bytes": 1250, "attempt": 1}
    assert done.json()["output"] == {"upload_id": "upload-a"}
    assert again.json()["metadata"] == stored.json()["metadata"] == {"bytes": 1250, "attempt": 1}
    assert failed.json()["code"] == "TOOL_FAILED"
    assert failed.json()["metadata"] == {"bytes": 1250, "attempt": 2, "stage": "commit"}
    success = document["paths"]["/v1/tools/upload/calls"]["post"]["responses"]["200"]
    schema = success["content"]["application/json"]["schema"]
    assert "metadata" in str(schema) or "metadata" in str(document["components"])
    assert document["components"]["schemas"]["Error"]["properties"]["metadata"]["type"] == "object"


def test_an_mcp_client_reads_the_metadata_in_the_results_meta(upload: Any) -> None:
    from mcp import Client

    from blade_runtime.serving.mcp import mcp_server

    async def scenario() -> tuple[Any, Any]:
        runtime = registered(upload)
        async with Client(mcp_server(runtime, principal=ANN)) as client:
            done = await client.call_tool("upload", {"name": "a"})
            failed = await client.call_tool("upload", {"name": "broken"})
        return done, failed

    done, failed = asyncio.run(scenario())
    assert not done.is_error
    assert done.meta is not None
    assert done.meta["io.blade"] == {"metadata": {"bytes": 1250, "attempt": 1}}
    assert "bytes" not in done.content[0].text  # what the model reads has none of it
    assert failed.is_error and failed.meta is not None
    assert failed.meta["io.blade"]["code"] == "TOOL_FAILED"
    assert failed.meta["io.blade"]["metadata"] == {"bytes": 1250, "attempt": 2, "stage": "commit"}


def test_the_typed_client_in_process_and_over_http_reads_the_metadata(upload: Any) -> None:
    from blade_runtime.serving.http import HttpTransport, create_app

    async def scenario() -> tuple[Any, ...]:
        runtime = registered(upload)
        local = upload.client.Client(runtime)
        app = create_app(runtime, authenticate=authenticate)
        transport = httpx.ASGITransport(app=app)
        remote = upload.client.Client(
            HttpTransport("http://127.0.0.1", headers=ALICE, transport=transport)
        )
        module = upload.files.upload_v1
        here = await local.upload(module.UploadInput(name="a"))
        there = await remote.upload(module.UploadInput(name="a"))
        failed = await remote.upload(module.UploadInput(name="broken"))
        return here, there, failed

    here, there, failed = asyncio.run(scenario())
    assert here.status == there.status == "success"
    assert here.metadata == there.metadata == {"bytes": 1250, "attempt": 1}
    assert failed.status == "error" and failed.metadata["stage"] == "commit"


def test_pydantic_ai_gets_a_tool_return_with_the_metadata(upload: Any) -> None:
    from pydantic_ai import Agent, ToolReturnPart
    from pydantic_ai.models.test import TestModel

    from blade_runtime.adapters.pydantic_ai import BladeToolset

    runtime = registered(upload)
    agent = Agent(TestModel(call_tools=["upload"]), toolsets=[BladeToolset(runtime)])
    result = asyncio.run(agent.run("upload a file"))
    [returned] = [
        part
        for message in result.all_messages()
        for part in getattr(message, "parts", [])
        if isinstance(part, ToolReturnPart)
    ]
    assert returned.metadata == {"bytes": 1250, "attempt": 1}
    assert returned.content == {"upload_id": f"upload-{returned.content['upload_id'][7:]}"}
    assert "bytes" not in str(returned.model_response_object())  # the model reads none of it
