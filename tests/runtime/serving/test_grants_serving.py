"""Standing grants through the operators' CLI and the HTTP API (tenant-checked)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_support import ALICE, BOB, CAROL, ROOT, TOKENS, authenticate, serving

from blade_runtime import CallContext, Runtime
from blade_runtime.core.permissions import by_kind
from blade_runtime.core.results import ToolPending, ToolSuccess
from blade_runtime.core.store import Store
from blade_runtime.serving.http import create_app
from blade_runtime.stores.sqlite import SQLiteStore
from blade_runtime.stores.urls import open_store

GOOD = {"service": "api", "version": "v1.2.3", "environment": "staging"}


def test_grants_over_http_are_listed_and_revoked_by_their_own_principal(
    example_package: Any, store: Store
) -> None:
    """As with calls and actions, a principal sees and revokes only its own grants (another
    principal's, of its tenant or not, does not exist for it); an operator, every one."""
    from blade_specs.deploy import deploy_service_v1 as deploy

    async def deploys(ctx: Any) -> Any:
        return deploy.DeployServiceOutput(deployed=True, steps=1)

    runtime = Runtime(store=store)
    runtime.register(deploy.SPEC, deploys)
    app = create_app(runtime, authenticate=authenticate)
    alice, bob, carol = TOKENS["token-alice"], TOKENS["token-bob"], TOKENS["token-carol"]

    with serving(app) as server:
        mine = server.run(runtime.grant(alice, "deploy_service", "api"))
        theirs = server.run(runtime.grant(bob, "deploy_service", "api"))
        carols = server.run(runtime.grant(carol, "deploy_service", "web"))

        async def scenario() -> dict[str, Any]:
            seen: dict[str, Any] = {}
            async with httpx.AsyncClient(base_url=server.url) as http:
                for who, headers in (
                    ("alice", ALICE),
                    ("bob", BOB),
                    ("carol", CAROL),
                    ("root", ROOT),
                ):
                    listed = await http.get("/v1/grants", headers=headers)
                    seen[who] = [g["grant_id"] for g in listed.json()["grants"]]
                seen["anonymous"] = (await http.get("/v1/grants")).status_code
                path = f"/v1/grants/{mine.grant_id}"
                seen["bob revokes"] = await http.delete(path, headers=BOB)
                seen["carol revokes"] = await http.delete(path, headers=CAROL)
                seen["alice revokes"] = await http.delete(path, headers=ALICE)
                seen["root revokes"] = await http.delete(
                    f"/v1/grants/{carols.grant_id}", headers=ROOT
                )
                seen["again"] = await http.delete(path, headers=ALICE)
                seen["by tool"] = await http.get("/v1/grants?tool=other", headers=ROOT)
                seen["after"] = (await http.get("/v1/grants", headers=ROOT)).json()
            return seen

        seen = asyncio.run(scenario())
    assert seen["alice"] == [mine.grant_id] and seen["bob"] == [theirs.grant_id]
    assert seen["carol"] == [carols.grant_id]  # alice's tenant, not alice's grants
    everyone = sorted([mine.grant_id, theirs.grant_id, carols.grant_id])
    assert sorted(seen["root"]) == everyone  # operators: all
    assert seen["anonymous"] == 401
    # another tenant's grant, or another principal's of the same tenant, does not exist
    for who in ("bob revokes", "carol revokes"):
        refused = seen[who]
        assert refused.status_code == 404 and refused.json()["code"] == "UNKNOWN_GRANT", who
        assert mine.grant_id in refused.json()["message"]
    assert seen["root revokes"].status_code == 200
    assert seen["root revokes"].json()["revoked"]["grant_id"] == carols.grant_id
    revoked = seen["alice revokes"]
    assert revoked.status_code == 200
    assert revoked.json()["revoked"] == {
        "grant_id": mine.grant_id,
        "tenant": "acme",
        "principal": "alice",
        "tool": "deploy_service",
        "subject": "api",
        "created_at": mine.created_at,
        "action_id": None,
        "spec_id": "deploy.deploy-service.v1",
        "point": "@permission-step",
    }
    assert seen["again"].status_code == 404
    assert seen["by tool"].json() == {"grants": [], "next": None}
    assert [g["grant_id"] for g in seen["after"]["grants"]] == [theirs.grant_id]
    assert [g.grant_id for g in store.grants()] == [theirs.grant_id]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blade_runtime.serving.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_list_filter_that_is_not_utf8_is_a_usage_error_before_the_store_is_opened(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    SQLiteStore(tmp_path / "cli.db").close()
    missing = f"sqlite:///{tmp_path / 'none.db'}"
    byte = "\udcff"  # how Python holds a byte (0xff) of argv that is not UTF-8
    for command in (
        ("grants", "list", "--tool"),
        ("grants", "list", "--tenant"),
        ("grants", "list", "--principal"),
        ("pending", "list", "--tool"),
        ("pending", "list", "--run"),
    ):
        for store in (url, missing):
            done = cli(*command, byte, "--store", store)
            assert done.returncode == 2, (command, done.stderr)
            assert done.stderr.splitlines() == [
                f"error: {command[2]} '\\udcff' is not UTF-8 text: pass it in UTF-8"
                " (or a UTF-8 locale)"
            ]
            assert done.stdout == ""
    assert not (tmp_path / "none.db").exists()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_an_operator_s_always_answer_makes_a_grant_the_cli_lists_and_revokes(
    example_package: Any, kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from blade_specs.deploy import deploy_service_v1 as deploy

    if kind == "postgres":
        url = request.getfixturevalue("postgres_url")
        store = open_store(url)
    else:
        url = f"sqlite:///{tmp_path / 'cli.db'}"
        store = SQLiteStore(tmp_path / "cli.db")
    request.addfinalizer(store.close)
    runs: list[str] = []

    async def deploys(ctx: Any) -> Any:
        runs.append(ctx.input.service)
        return deploy.DeployServiceOutput(deployed=True, steps=1)

    runtime = Runtime(store=store, permission=by_kind())
    runtime.register(deploy.SPEC, deploys)
    alice = CallContext(TOKENS["token-alice"])
    first = asyncio.run(runtime.call("deploy_service", GOOD, context=alice))
    assert isinstance(first, ToolPending)
    answer = '{"decision": "approve", "always": true}'
    submitted = cli("pending", "submit", first.action.action_id, answer, "--store", url)
    assert submitted.returncode == 0, submitted.stderr
    assert "alice always allows deploy_service ''" in submitted.stdout
    listed = cli("grants", "list", "--store", url, "--tenant", "acme", "--json")
    assert listed.returncode == 0, listed.stderr
    [grant] = json.loads(listed.stdout)
    assert (grant["principal"], grant["tool"], grant["subject"]) == ("alice", "deploy_service", "")
    assert grant["action_id"] == first.action.action_id
    other = cli("grants", "list", "--store", url, "--tenant", "globex")
    assert other.returncode == 0 and other.stdout == ""

    async def again() -> Any:  # the recovery resumes the first call; the next is not asked
        await runtime.recover()
        return await runtime.call("deploy_service", GOOD, context=alice)

    assert isinstance(asyncio.run(again()), ToolSuccess) and runs == ["api", "api"]
    revoked = cli("grants", "revoke", grant["grant_id"], "--store", url)
    assert revoked.returncode == 0, revoked.stderr
    missing = cli("grants", "revoke", grant["grant_id"], "--store", url)
    assert missing.returncode == 1
    assert missing.stderr.strip() == f"error: no grant {grant['grant_id']!r}"
    asked = asyncio.run(runtime.call("deploy_service", GOOD, context=alice))
    assert isinstance(asked, ToolPending)
    asyncio.run(runtime.close())
