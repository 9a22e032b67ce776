"""Effects (seed 000, "Runtime progress, messages, and effects"): a running tool can yield an
effect that updates runtime context, messages or permissions, and the stream projects it into
events. Here a spec declares its effects (typed like every other slot), the tool emits them with
``ctx.effects``, the runtime records each with the call's durability (applied once, however often
an entry runs), later calls of the run read the patched context, a permission effect becomes a
standing grant of the caller's that the policy still rules, and every surface shows them."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import build_and_import, spec
from http_support import ALICE, authenticate

from blade_runtime import Allow, Ask, CallContext, Deny, Principal, ResumeEntry, Runtime
from blade_runtime.core.effects import merge_patch
from blade_runtime.core.results import ErrorCode, ToolError, ToolPending, ToolSuccess
from blade_runtime.core.store import Store

ANN = Principal("alice", "acme")  # http_support's token-alice
CAROL = Principal("carol", "acme")  # ann's tenant, another principal
BOB = Principal("bob", "globex")
NAME = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
UPLOADED = {
    "type": "object",
    "properties": {"upload_id": {"type": "string"}},
    "required": ["upload_id"],
}
PATCH = {
    "type": "object",
    "properties": {
        "upload_id": {"type": ["string", "null"]},
        "uploads": {"type": "integer"},
        "labels": {"type": "object", "additionalProperties": {"type": ["string", "null"]}},
    },
    "additionalProperties": False,
}
MESSAGE = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("effects")
    build_and_import(
        root,
        "effects_pkg",
        spec(
            "files.upload.v1",
            description="Uploads a file and remembers the upload for the rest of the run.",
            inputSchema=NAME,
            outputSchema=UPLOADED,
            sideEffect="idempotent",
            effects={
                "context": PATCH,
                "message": MESSAGE,
                "permissions": {"tools": ["files.publish.v1"]},
            },
        ),
        spec(
            "files.publish.v1",
            description="Publishes the run's upload.",
            kind="write",
            inputSchema={"type": "object", "properties": {}},
            outputSchema={
                "type": "object",
                "properties": {"published": {"type": ["string", "null"]}},
                "required": ["published"],
            },
        ),
        spec(
            "files.peek.v1",
            description="Reads a file, and declares no effects.",
            inputSchema=NAME,
            sideEffect="pure",
        ),
    )
    importlib.import_module("effects_pkg.client")
    return importlib.import_module("effects_pkg.files")


def uploader(tools: Any, entries: list[str] | None = None) -> Any:
    """Uploads ``name``: patches the run's context, posts a message, grants ``publish``; a name
    "broken" fails after its first effect, "bad" posts a message its schema rejects."""
    upload = importlib.import_module("effects_pkg.files.upload_v1")
    publish = importlib.import_module("effects_pkg.files.publish_v1")

    async def run(ctx: Any) -> Any:
        if entries is not None:
            entries.append(ctx.call.call_id)
        name = ctx.input.name
        await ctx.effects.patch_context(
            upload.UploadContextPatch(upload_id=f"u-{name}", uploads=1, labels={"a": "x"})
        )
        if name == "broken":
            ctx.fail("The upload broke after patching.")
        await ctx.effects.post_message({"text": 42} if name == "bad" else {"text": f"got {name}"})
        await ctx.effects.grant(publish.SPEC)
        return upload.UploadOutput(upload_id=f"u-{name}")

    return run


async def publisher(ctx: Any) -> Any:
    run = await ctx.run_context()
    return {"published": run.get("upload_id")}


def asking(request: Any) -> Any:
    """A person approves every publish, unless a grant already does."""
    return Ask("Publish?") if request.name == "publish" else Allow()


def registered(tools: Any, store: Store | None = None, **options: Any) -> Runtime:
    runtime = Runtime(store=store, **options)
    runtime.register(tools.upload_v1.SPEC, uploader(tools))
    runtime.register(tools.publish_v1.SPEC, publisher)
    return runtime


def test_a_context_patch_is_seen_by_later_calls_of_the_same_run_and_no_other(
    tools: Any, store: Store
) -> None:
    async def scenario() -> tuple[Any, ...]:
        runtime = registered(tools, store)
        ann = CallContext(principal=ANN)
        before = await runtime.call("publish", {}, run_id="r-1", context=ann)
        done = await runtime.call("upload", {"name": "a"}, run_id="r-1", context=ann)
        after = await runtime.call("publish", {}, run_id="r-1", context=ann)
        elsewhere = await runtime.call("publish", {}, run_id="r-2", context=ann)
        carols = await runtime.call("publish", {}, run_id="r-1", context=CallContext(CAROL))
        contexts = [
            await runtime.run_context("r-1", principal=who) for who in (ANN, CAROL, BOB, None)
        ]
        await runtime.close()
        return before, done, after, elsewhere, carols, contexts

    before, done, after, elsewhere, carols, contexts = asyncio.run(scenario())
    assert isinstance(before, ToolSuccess) and before.output == {"published": None}
    assert isinstance(done, ToolSuccess)
    assert [e.type for e in done.effects] == ["context_patch", "message", "permission"]
    assert done.effects[0].value == {"upload_id": "u-a", "uploads": 1, "labels": {"a": "x"}}
    assert isinstance(after, ToolSuccess) and after.output == {"published": "u-a"}
    assert isinstance(elsewhere, ToolSuccess) and elsewhere.output == {"published": None}
    assert isinstance(carols, ToolSuccess) and carols.output == {"published": None}
    assert contexts[0] == {"upload_id": "u-a", "uploads": 1, "labels": {"a": "x"}}
    assert contexts[1:] == [{}, {}, {}]  # another principal, another tenant, nobody


def test_patches_merge_in_order_and_null_removes_a_key(tools: Any, store: Store) -> None:
    upload = tools.upload_v1

    async def patching(ctx: Any) -> Any:
        await ctx.effects.patch_context({"labels": {"a": "1", "b": "2"}, "uploads": 1})
        await ctx.effects.patch_context({"labels": {"a": None, "c": "3"}, "upload_id": "u"})
        await ctx.effects.patch_context({"upload_id": None})
        return upload.UploadOutput(upload_id="u")

    async def scenario() -> dict[str, Any]:
        runtime = Runtime(store=store)
        runtime.register(upload.SPEC, patching)
        await runtime.call("upload", {"name": "a"}, run_id="r-m", context=CallContext(ANN))
        context = await runtime.run_context("r-m", principal=ANN)
        await runtime.close()
        return context

    assert asyncio.run(scenario()) == {"labels": {"b": "2", "c": "3"}, "uploads": 1}


def test_effects_are_events_of_the_run_in_order_with_the_calls_other_events(
    tools: Any, store: Store
) -> None:
    async def scenario() -> list[tuple[str, Any]]:
        runtime = registered(tools, store)
        subscription = runtime.subscribe("r-e", after=0 if store.durable else None)
        await runtime.call("upload", {"name": "a"}, run_id="r-e", context=CallContext(ANN))
        await subscription.aclose()
        seen = [(event.kind, event.payload) async for event in subscription]
        await runtime.close()
        return seen

    seen = asyncio.run(scenario())
    kinds = [kind for kind, _ in seen]
    assert kinds[0] == "started" and kinds[-1] == "result"
    effects = [payload for kind, payload in seen if kind == "effect"]
    assert [e["type"] for e in effects] == ["context_patch", "message", "permission"]
    assert effects[1]["value"] == {"text": "got a"}
    assert effects[2]["value"] == {
        "change": "grant",
        "tool": "publish",
        "spec_id": "files.publish.v1",
        "point": "@permission",
        "subject": "",
    }


def test_an_effect_its_schema_rejects_is_not_recorded_and_fails_the_tool(
    tools: Any, store: Store
) -> None:
    async def scenario() -> tuple[Any, Any]:
        runtime = registered(tools, store)
        bad = await runtime.call("upload", {"name": "bad"}, run_id="r-b", context=CallContext(ANN))
        listed = await runtime.run_effects("r-b", principal=ANN)
        await runtime.close()
        return bad, listed

    bad, listed = asyncio.run(scenario())
    assert isinstance(bad, ToolError) and bad.code is ErrorCode.TOOL_ERROR
    # the patch before it stands (recorded, applied: an effect is not undone), and the result
    # says so; the rejected message and what came after it never happened
    assert [e.type for e in bad.effects] == ["context_patch"]
    assert [e.type for e in listed] == ["context_patch"]


def test_a_tool_emits_only_the_effects_its_spec_declares(tools: Any) -> None:
    caught: list[str] = []

    async def sneaky(ctx: Any) -> Any:
        from blade_runtime import EffectRejected

        for attempt in (
            lambda: ctx.effects.patch_context({"admin": True}),
            lambda: ctx.effects.post_message({"text": "hi"}),
            lambda: ctx.effects.grant("publish"),
        ):
            try:
                await attempt()
            except EffectRejected as refused:
                caught.append(str(refused))
        return {"read": True}

    async def scenario() -> tuple[Any, Any]:
        runtime = registered(tools)
        runtime.register(tools.peek_v1.SPEC, sneaky)
        done = await runtime.call("peek", {"name": "a"}, run_id="r-s", context=CallContext(ANN))
        context = await runtime.run_context("r-s", principal=ANN)
        await runtime.close()
        return done, context

    done, context = asyncio.run(scenario())
    assert isinstance(done, ToolSuccess) and done.effects == ()
    assert context == {}
    assert len(caught) == 3
    assert "declares no effects.context" in caught[0]
    assert "declares no effects.message" in caught[1]
    assert "declares no effects.permissions" in caught[2]


def test_a_permission_effect_grants_only_what_the_spec_lists_to_the_callers_own_principal(
    tools: Any,
) -> None:
    upload = tools.upload_v1
    refused: list[str] = []

    async def overreaching(ctx: Any) -> Any:
        from blade_runtime import EffectRejected

        for target in ("upload", tools.peek_v1.SPEC, "nonesuch"):
            try:
                await ctx.effects.grant(target)
            except EffectRejected as error:
                refused.append(str(error))
        return upload.UploadOutput(upload_id="u")

    async def scenario() -> tuple[Any, Any, list[Any]]:
        runtime = Runtime(permission=asking)
        runtime.register(upload.SPEC, overreaching)
        runtime.register(tools.peek_v1.SPEC, lambda ctx: {"read": True})
        done = await runtime.call("upload", {"name": "a"}, context=CallContext(ANN))
        anonymous = await runtime.call("upload", {"name": "a"})
        grants = runtime.store.grants()
        await runtime.close()
        return done, anonymous, grants

    done, anonymous, grants = asyncio.run(scenario())
    assert isinstance(done, ToolSuccess) and isinstance(anonymous, ToolSuccess)
    assert grants == []
    assert "runs files.upload.v1, which its effects.permissions does not list" in refused[0]
    assert "not 'files.peek.v1'" in refused[1]
    assert "no tool named 'nonesuch'" in refused[2]


def test_a_granted_tool_runs_without_asking_its_principal_and_only_it_and_a_denial_stands(
    tools: Any, store: Store
) -> None:
    async def scenario() -> tuple[Any, ...]:
        runtime = registered(tools, store, permission=asking)
        ann, carol, bob = (CallContext(p) for p in (ANN, CAROL, BOB))
        asked = await runtime.call("publish", {}, run_id="r-g", context=ann)
        await runtime.call("upload", {"name": "a"}, run_id="r-g", context=ann)
        granted = await runtime.call("publish", {}, run_id="r-g", context=ann)
        other_run = await runtime.call("publish", {}, run_id="r-other", context=ann)
        carols = await runtime.call("publish", {}, run_id="r-g", context=carol)
        bobs = await runtime.call("publish", {}, run_id="r-g", context=bob)
        listed = store.grants(tenant="acme", principal="alice")
        denying = registered(tools, store, permission=lambda request: Deny("Not today."))
        denied = await denying.call("publish", {}, run_id="r-g", context=ann)
        await denying.close()
        await runtime.close()
        return asked, granted, other_run, carols, bobs, listed, denied

    asked, granted, other_run, carols, bobs, listed, denied = asyncio.run(scenario())
    assert isinstance(asked, ToolPending)
    assert isinstance(granted, ToolSuccess) and granted.output == {"published": "u-a"}
    assert isinstance(other_run, ToolSuccess)  # a standing grant: the principal's, every run
    assert isinstance(carols, ToolPending) and isinstance(bobs, ToolPending)
    assert [(g.tool, g.spec_id, g.point, g.subject) for g in listed] == [
        ("publish", "files.publish.v1", "@permission", "")
    ]
    assert isinstance(denied, ToolError) and denied.code is ErrorCode.PERMISSION_DENIED


def test_a_revoke_effect_takes_the_grant_back(tools: Any, store: Store) -> None:
    upload, publish = tools.upload_v1, tools.publish_v1

    async def revoking(ctx: Any) -> Any:
        await ctx.effects.revoke(publish.SPEC)
        return upload.UploadOutput(upload_id="u")

    async def scenario() -> tuple[Any, Any, Any]:
        runtime = registered(tools, store, permission=asking)
        ann = CallContext(ANN)
        await runtime.call("upload", {"name": "a"}, run_id="r-r", context=ann)
        granted = await runtime.call("publish", {}, run_id="r-r", context=ann)
        runtime.unregister("upload")
        runtime.register(upload.SPEC, revoking)
        revoked = await runtime.call("upload", {"name": "a"}, run_id="r-r", context=ann)
        asked = await runtime.call("publish", {}, run_id="r-r", context=ann)
        await runtime.close()
        return granted, revoked, asked

    granted, revoked, asked = asyncio.run(scenario())
    assert isinstance(granted, ToolSuccess)
    assert revoked.effects[0].value["change"] == "revoke"
    assert isinstance(asked, ToolPending)
    assert store.grants(tenant="acme", principal="alice") == []


def test_http_lists_a_calls_effects_and_serves_the_runs_context_to_its_principal_only(
    tools: Any,
) -> None:
    from blade_runtime.serving.http import create_app

    async def scenario() -> tuple[Any, ...]:
        runtime = registered(tools)
        app = create_app(runtime, authenticate=authenticate)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            done = await http.post(
                "/v1/tools/upload/calls?run_id=r-h", json={"name": "a"}, headers=ALICE
            )
            failed = await http.post(
                "/v1/tools/upload/calls?run_id=r-h", json={"name": "broken"}, headers=ALICE
            )
            mine = await http.get("/v1/runs/r-h/context", headers=ALICE)
            theirs = await http.get(
                "/v1/runs/r-h/context", headers={"Authorization": "Bearer token-bob"}
            )
            document = (await http.get("/v1/openapi.json", headers=ALICE)).json()
        await runtime.close()
        return done, failed, mine, theirs, document

    done, failed, mine, theirs, document = asyncio.run(scenario())
    assert done.status_code == 200, done.text
    assert [e["type"] for e in done.json()["effects"]] == ["context_patch", "message", "permission"]
    assert failed.json()["code"] == "TOOL_FAILED"
    assert [e["type"] for e in failed.json()["effects"]] == ["context_patch"]
    assert mine.json() == {
        "run_id": "r-h",
        "context": {"upload_id": "u-broken", "uploads": 1, "labels": {"a": "x"}},
    }
    assert theirs.status_code == 200 and theirs.json()["context"] == {}
    assert "/v1/runs/{run_id}/context" in document["paths"]
    assert "Effect" in document["components"]["schemas"]


def test_the_typed_client_reads_effects_and_the_runs_context_in_process_and_over_http(
    tools: Any,
) -> None:
    from blade_runtime.client import RuntimeTransport
    from blade_runtime.serving.http import HttpTransport, create_app

    client_module = importlib.import_module("effects_pkg.client")

    async def scenario() -> tuple[Any, ...]:
        runtime = registered(tools)
        local = client_module.Client(RuntimeTransport(runtime, ANN))
        app = create_app(runtime, authenticate=authenticate)
        transport = httpx.ASGITransport(app=app)
        remote = client_module.Client(
            HttpTransport("http://127.0.0.1", headers=ALICE, transport=transport)
        )
        here = await local.upload(tools.upload_v1.UploadInput(name="a"), run_id="r-c")
        there = await remote.upload(tools.upload_v1.UploadInput(name="b"), run_id="r-c")
        contexts = (await local.run_context("r-c"), await remote.run_context("r-c"))
        await runtime.close()
        return here, there, contexts

    here, there, contexts = asyncio.run(scenario())
    assert [e.type for e in here.effects] == ["context_patch", "message", "permission"]
    assert [e.type for e in there.effects] == ["context_patch", "message", "permission"]
    assert there.effects[1].value == {"text": "got b"}
    assert contexts[0] == contexts[1] == {"upload_id": "u-b", "uploads": 1, "labels": {"a": "x"}}


def test_pydantic_ai_gets_the_posted_message_for_the_model_and_the_effects_as_metadata(
    tools: Any,
) -> None:
    from pydantic_ai.messages import ToolReturn

    from blade_runtime.adapters.pydantic_ai import _returned

    async def scenario() -> Any:
        runtime = registered(tools)
        done = await runtime.call("upload", {"name": "a"}, context=CallContext(ANN))
        await runtime.close()
        return done

    returned = _returned(asyncio.run(scenario()))
    assert isinstance(returned, ToolReturn)
    assert returned.return_value == {"upload_id": "u-a"}
    assert returned.content == ['{"text":"got a"}']
    assert [e["type"] for e in returned.metadata["blade_effects"]] == [
        "context_patch",
        "message",
        "permission",
    ]


# -- applied once, however often an entry runs --------------------------------------------------

CRASHER = """
import asyncio, sys
sys.path.insert(0, {out!r})
from pathlib import Path
from blade_runtime import CallContext, Principal, Runtime
from blade_runtime.stores.urls import open_store
from effects_pkg.files import publish_v1, upload_v1

async def upload(ctx):
    await ctx.effects.patch_context({{"upload_id": "u-1", "uploads": 1}})
    await ctx.effects.post_message({{"text": "uploaded"}})
    await ctx.effects.grant(publish_v1.SPEC)
    Path({mark!r}).write_text("emitted")
    await asyncio.sleep(600)  # killed here, its effects recorded

async def main():
    runtime = Runtime(store=open_store({url!r}), lease_s=2.0)
    runtime.register(upload_v1.SPEC, upload)
    runtime.register(publish_v1.SPEC, lambda ctx: {{"published": None}})
    await runtime.call(
        "upload", {{"name": "a"}}, call_id="c-1", run_id="r-1",
        context=CallContext(Principal("alice", "acme")),
    )

asyncio.run(main())
"""


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_an_effect_of_a_call_replayed_after_kill_9_is_applied_once(
    tools: Any, kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from blade_runtime.stores.urls import open_store

    if kind == "postgres":
        url: str = request.getfixturevalue("postgres_url")
    else:
        url = f"sqlite:///{tmp_path / 'effects.db'}"
    out = str(Path(tools.__file__).parents[2])
    mark = tmp_path / "emitted"
    script = CRASHER.format(out=out, mark=str(mark), url=url)
    child = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 60
    while not mark.exists():
        assert time.monotonic() < deadline and child.poll() is None, "the child never emitted"
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()

    entries: list[str] = []

    async def scenario() -> tuple[Any, ...]:
        store = open_store(url)
        runtime = Runtime(store=store, lease_s=2.0)
        runtime.register(tools.upload_v1.SPEC, uploader(tools, entries))
        runtime.register(tools.publish_v1.SPEC, publisher)
        recovered: list[Any] = []
        until = time.monotonic() + 60  # a dead PostgreSQL session, or its lease, frees it
        while not recovered and time.monotonic() < until:
            recovered = await runtime.recover()
            if not recovered:
                await asyncio.sleep(0.2)
        effects = await runtime.run_effects("r-1", principal=ANN)
        context = await runtime.run_context("r-1", principal=ANN)
        events = [e for e in store.events("r-1", 0) if e.kind == "effect"]
        grants = store.grants(tenant="acme", principal="alice")
        await runtime.close()
        store.close()
        return recovered, effects, context, events, grants

    recovered, effects, context, events, grants = asyncio.run(scenario())
    assert [r.call.call_id for r in recovered] == ["c-1"] and entries == ["c-1"]
    done = recovered[0]
    assert isinstance(done, ToolSuccess)
    # the replayed entry emitted its three effects again; each is recorded (and applied) once
    assert [e.type for e in done.effects] == ["context_patch", "message", "permission"]
    assert [e.effect_id for e in done.effects] == [e.effect_id for e in effects]
    assert [e.type for e in effects] == ["context_patch", "message", "permission"]
    assert len(events) == 3
    assert len(grants) == 1
    # the first entry's patch stands (the replay's, at the same place, is the same effect)
    assert context == {"upload_id": "u-1", "uploads": 1}


# -- the merge patch itself ---------------------------------------------------------------------


def test_merge_patch_follows_rfc_7396_examples() -> None:
    cases = [  # RFC 7396, appendix A
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"a": "foo"}, None, None),
        ({"a": "foo"}, "bar", "bar"),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ]
    for target, patch, expected in cases:
        assert merge_patch(target, patch) == expected


# -- typed like every other slot ------------------------------------------------------------------

TYPED = """
from effects_pkg.files import publish_v1, upload_v1
from pydantic import JsonValue

from blade_runtime import Effect


async def upload(ctx: upload_v1.UploadExecution) -> upload_v1.UploadOutput:
    made: Effect = await ctx.effects.patch_context(upload_v1.UploadContextPatch(uploads=2))
    await ctx.effects.post_message(upload_v1.UploadMessage(text=made.effect_id))
    await ctx.effects.grant(publish_v1.SPEC, subject="bucket")
    await ctx.effects.revoke("publish")
    context: dict[str, JsonValue] = await ctx.run_context()
    return upload_v1.UploadOutput(upload_id=str(context))


implementation: upload_v1.UploadImplementation = upload
"""

MISTYPED = """
from effects_pkg.files import peek_v1, publish_v1, upload_v1


async def upload(ctx: upload_v1.UploadExecution) -> upload_v1.UploadOutput:
    await ctx.effects.patch_context(upload_v1.UploadMessage(text="a"))  # the message type
    await ctx.effects.grant(peek_v1.SPEC)  # a tool the spec does not list
    return upload_v1.UploadOutput(upload_id="u")


async def peek(ctx: peek_v1.PeekExecution) -> object:
    await ctx.effects.post_message({"text": "a"})  # declares no effects
    return None
"""


def test_mypy_holds_an_implementations_effects_to_its_spec(tools: Any) -> None:
    from conftest import run_mypy

    out = Path(tools.__file__).parents[2]  # beside the package, where mypy finds it
    (out / "typed_ok.py").write_text(TYPED)
    (out / "typed_bad.py").write_text(MISTYPED)
    good = run_mypy(out / "typed_ok.py", cwd=out)
    bad = run_mypy(out / "typed_bad.py", cwd=out)
    assert good.returncode == 0, good.stdout
    errors = [line for line in bad.stdout.splitlines() if "typed_bad.py" in line]
    assert any(":6:" in line and "UploadContextPatch" in line for line in errors), bad.stdout
    assert any(":7:" in line and "grant" in line for line in errors), bad.stdout
    assert any(":12:" in line and "effects" in line for line in errors), bad.stdout
    assert len(errors) == 3, bad.stdout


def test_an_mcp_client_reads_the_effects_in_the_results_meta(tools: Any) -> None:
    from mcp import Client

    from blade_runtime.serving.mcp import mcp_server

    async def scenario() -> tuple[Any, Any]:
        runtime = registered(tools)
        async with Client(mcp_server(runtime, principal=ANN)) as client:
            done = await client.call_tool("upload", {"name": "a"})
            failed = await client.call_tool("upload", {"name": "broken"})
        await runtime.close()
        return done, failed

    done, failed = asyncio.run(scenario())
    assert not done.is_error and done.meta is not None
    effects = done.meta["io.blade"]["effects"]
    assert [e["type"] for e in effects] == ["context_patch", "message", "permission"]
    assert effects[1]["value"] == {"text": "got a"}
    assert "effect" not in done.content[0].text  # what the model reads holds none of them
    assert failed.is_error and failed.meta is not None
    assert failed.meta["io.blade"]["code"] == "TOOL_FAILED"
    assert [e["type"] for e in failed.meta["io.blade"]["effects"]] == ["context_patch"]


def test_a_temporal_workers_store_refuses_a_permission_effect_that_would_not_last(
    tools: Any,
) -> None:
    """A Temporal worker runs each activity on a store of its own that keeps nothing after it:
    a grant made there would hold in that worker only, so the effect is refused, saying why."""
    from blade_runtime.temporal.store import ActivityStore

    async def scenario() -> Any:
        runtime = registered(tools, ActivityStore())
        done = await runtime.call("upload", {"name": "a"}, context=CallContext(ANN))
        await runtime.close()
        return done

    done = asyncio.run(scenario())
    assert isinstance(done, ToolError) and done.code is ErrorCode.TOOL_ERROR
    assert [e.type for e in done.effects] == ["context_patch", "message"]


def test_langgraph_keeps_the_effects_in_the_tool_messages_artifact(tools: Any) -> None:
    """LangChain's place for what the application reads and the model does not: the
    ToolMessage's artifact."""
    from langchain_core.messages import ToolMessage

    from blade_runtime.adapters.langgraph import structured_tools

    async def scenario() -> list[Any]:
        runtime = registered(tools)
        by_name = {tool.name: tool for tool in structured_tools(runtime, principal=ANN)}
        config: Any = {"configurable": {"thread_id": "x"}}
        answered = [
            await by_name[name].ainvoke(
                {"name": name, "args": args, "id": f"t-{name}", "type": "tool_call"}, config
            )
            for name, args in (("upload", {"name": "a"}), ("publish", {}))
        ]
        await runtime.close()
        return answered

    upload, publish = asyncio.run(scenario())
    assert isinstance(upload, ToolMessage) and upload.content == '{"upload_id":"u-a"}'
    effects = upload.artifact["effects"]
    assert [e["type"] for e in effects] == ["context_patch", "message", "permission"]
    assert isinstance(publish, ToolMessage) and publish.artifact is None  # none emitted


def test_a_spec_may_declare_any_one_effect_alone(tmp_path: Path) -> None:
    """Only a context patch, only a message, only permissions: each builds, passes mypy --strict
    and ruff, and its ctx.effects has the methods of what it declares and no others."""
    from conftest import run_mypy, run_ruff

    build_and_import(
        tmp_path,
        "effect_parts_pkg",
        spec("parts.patcher.v1", effects={"context": {"type": "object"}}),
        spec("parts.poster.v1", effects={"message": {"type": "string"}}),
        spec("parts.granter.v1", effects={"permissions": {"tools": ["parts.poster.v1"]}}),
    )
    out = tmp_path / "out"
    assert run_mypy(out / "effect_parts_pkg", cwd=out).returncode == 0
    assert run_ruff(out / "effect_parts_pkg").returncode == 0
    modules = {
        name: importlib.import_module(f"effect_parts_pkg.parts.{name}_v1")
        for name in ("patcher", "poster", "granter")
    }
    methods = {
        name: {
            m
            for m in ("patch_context", "post_message", "grant", "revoke")
            if hasattr(getattr(module, f"{name.capitalize()}Effects"), m)
        }
        for name, module in modules.items()
    }
    assert methods == {
        "patcher": {"patch_context"},
        "poster": {"post_message"},
        "granter": {"grant", "revoke"},
    }
    declared = modules["granter"].SPEC.effects
    assert declared.permissions == ("parts.poster.v1",) and declared.context_schema is None


# -- every entry of a call: a permission's replay, a suspension, a child ----------------------


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("effects-flow")
    message = {"effects": {"message": MESSAGE}}
    build_and_import(
        root,
        "effects_flow_pkg",
        spec("flow.asker.v1", sideEffect="idempotent", **message),
        spec(
            "flow.waiter.v1",
            suspend={"approve": {"suspendSchema": {"type": "object"}, "resumeSchema": {}}},
            **message,
        ),
        spec("flow.parent.v1", children=["flow.child.v1"]),
        spec("flow.child.v1", **message),
    )
    return importlib.import_module("effects_flow_pkg.flow")


def test_an_execution_a_permissions_answer_replays_emits_its_effects_once(
    flow: Any, store: Store
) -> None:
    """A permission's answer enters the tool again from the top: what it posted before the
    step is the same effect, not a second one; what it posts after is new."""
    asker = importlib.import_module("effects_flow_pkg.flow.asker_v1")
    entries: list[str] = []

    async def asking(ctx: Any) -> Any:
        entries.append(type(ctx.entry).__name__)
        await ctx.effects.post_message({"text": "before"})
        answer = await ctx.request_permission("Go on?", subject="step")
        await ctx.effects.post_message({"text": f"after {answer.decision}"})
        return {"done": True}

    async def scenario() -> tuple[Any, ...]:
        runtime = Runtime(store=store)
        runtime.register(asker.SPEC, asking)
        waiting = await runtime.call("asker", {}, run_id="r-p", context=CallContext(ANN))
        assert isinstance(waiting, ToolPending)
        done = await runtime.submit(
            waiting.action.action_id, {"decision": "approve"}, principal=ANN
        )
        listed = await runtime.run_effects("r-p", principal=ANN)
        await runtime.close()
        return done, listed

    done, listed = asyncio.run(scenario())
    assert entries == ["InitialEntry", "ResumeEntry"]  # the prefix ran twice
    assert isinstance(done, ToolSuccess)
    assert [e.value for e in listed] == [{"text": "before"}, {"text": "after approve"}]
    assert [e.effect_id for e in done.effects] == [e.effect_id for e in listed]


def test_a_result_lists_the_effects_of_earlier_entries_and_of_children(
    flow: Any, store: Store
) -> None:
    waiter = importlib.import_module("effects_flow_pkg.flow.waiter_v1")
    parent = importlib.import_module("effects_flow_pkg.flow.parent_v1")
    child = importlib.import_module("effects_flow_pkg.flow.child_v1")

    async def waiting(ctx: Any) -> Any:
        if isinstance(ctx.entry, ResumeEntry):
            await ctx.effects.post_message({"text": "resumed"})
            return {"done": True}
        await ctx.effects.post_message({"text": "asked"})
        ctx.suspend("approve", {})

    async def calling(ctx: Any) -> Any:
        await ctx.tools.call(child.SPEC, child.SPEC.input_type())
        await ctx.tools.call(child.SPEC, child.SPEC.input_type())
        return {"children": 2}

    async def posting(ctx: Any) -> Any:
        await ctx.effects.post_message({"text": ctx.call.call_id})
        return {}

    async def scenario() -> tuple[Any, ...]:
        runtime = Runtime(store=store)
        runtime.register(waiter.SPEC, waiting)
        runtime.register(parent.SPEC, calling)
        runtime.register(child.SPEC, posting)
        ann = CallContext(ANN)
        pending = await runtime.call("waiter", {}, run_id="r-w", context=ann)
        assert isinstance(pending, ToolPending)
        resumed = await runtime.submit(pending.action.action_id, {}, principal=ANN)
        parented = await runtime.call("parent", {}, call_id="p-1", run_id="r-w", context=ann)
        events = [
            e.payload["effect_id"]
            for e in (store.events("r-w", 0) if store.durable else [])
            if e.kind == "effect"
        ]
        listed = await runtime.run_effects("r-w", principal=ANN)
        await runtime.close()
        return resumed, parented, events, listed

    resumed, parented, events, listed = asyncio.run(scenario())
    assert [e.value for e in resumed.effects] == [{"text": "asked"}, {"text": "resumed"}]
    assert [e.value for e in parented.effects] == [
        {"text": "p-1/child/1"},
        {"text": "p-1/child/2"},
    ]
    # the store's order is its events' order (a subscriber folds what run_context folds)
    assert not events or events == [e.effect_id for e in listed]


def test_calls_running_at_once_in_a_run_fold_their_patches_in_their_events_order(
    tools: Any, store: Store
) -> None:
    """Twelve calls of one run at once, each patching the same key three times: every effect
    is recorded once, the store lists them in their events' order, and the run's context is
    the last event's patch (what a subscriber folding the stream gets)."""
    upload = tools.upload_v1

    async def patching(ctx: Any) -> Any:
        for step in range(3):
            await ctx.effects.patch_context({"upload_id": f"{ctx.input.name}-{step}"})
            await asyncio.sleep(0)
        return upload.UploadOutput(upload_id=ctx.input.name)

    async def scenario() -> tuple[Any, ...]:
        runtime = Runtime(store=store)
        runtime.register(upload.SPEC, patching)
        ann = CallContext(ANN)
        done = await asyncio.gather(
            *(
                runtime.call("upload", {"name": f"c{n}"}, run_id="r-x", context=ann)
                for n in range(12)
            )
        )
        listed = await runtime.run_effects("r-x", principal=ANN)
        context = await runtime.run_context("r-x", principal=ANN)
        events = [e.payload for e in store.events("r-x", 0) if e.kind == "effect"]
        await runtime.close()
        return done, listed, context, events

    done, listed, context, events = asyncio.run(scenario())
    assert all(isinstance(result, ToolSuccess) for result in done)
    assert len(listed) == 36 and len({e.effect_id for e in listed}) == 36
    if store.durable:
        assert [e["effect_id"] for e in events] == [e.effect_id for e in listed]
    assert context == {"upload_id": listed[-1].value["upload_id"]}


def test_the_http_event_stream_carries_a_calls_effects_in_order(tools: Any, tmp_path: Path) -> None:
    """The stream projects effects into events (seed 000): over a real server on 127.0.0.1,
    a client reading ``GET /v1/runs/{run}/events`` gets each effect as an ``effect`` event,
    between the call's start and its result."""
    from http_support import serving

    from blade_runtime.serving.http import create_app
    from blade_runtime.stores.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "stream.db")
    runtime = registered(tools, store)
    app = create_app(runtime, authenticate=authenticate)
    with serving(app) as server:
        called = httpx.post(
            f"{server.url}/v1/tools/upload/calls?run_id=r-sse",
            json={"name": "a"},
            headers=ALICE,
            timeout=30,
        )
        assert called.status_code == 200, called.text
        seen: list[tuple[str, Any]] = []
        with httpx.stream(
            "GET", f"{server.url}/v1/runs/r-sse/events?after=0", headers=ALICE, timeout=30
        ) as stream:
            kind = ""
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    kind = line[len("event: ") :]
                elif line.startswith("data: "):
                    seen.append((kind, json.loads(line[len("data: ") :])))
                    if kind == "result":
                        break
    asyncio.run(runtime.close())
    store.close()
    kinds = [kind for kind, _ in seen]
    assert kinds == ["started", "effect", "effect", "effect", "result"], kinds
    effects = [payload["payload"] for kind, payload in seen if kind == "effect"]
    assert [e["type"] for e in effects] == ["context_patch", "message", "permission"]
    assert effects[1]["value"] == {"text": "got a"}
