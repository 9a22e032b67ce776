"""Tools on Temporal, against a real dev server: activities running the runtime's pipeline, the
side effect as retry policy, pending actions held by workflows and answered with updates."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from process_worker import Tools
from temporal_support import DevServer, Workers, free_port
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from blade_runtime import ResumeEntry, Runtime
from blade_runtime.core.caller import OPERATOR, CallContext, Principal
from blade_runtime.core.permissions import Allow, Ask, PermissionRequest
from blade_runtime.temporal import ActivityStore, TemporalTools, worker, workflow_id

# How long after its last heartbeat a worker is taken for dead: short where a test kills one,
# longer elsewhere, so that a loaded machine's late heartbeat never looks like a death.
KILLED_HEARTBEAT_S = 1.5
HEARTBEAT_S = 10.0


def run(coroutine: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await coroutine

    return asyncio.run(main())


@dataclass
class Place:
    server: DevServer
    package: Path
    folder: Path
    task_queue: str

    @property
    def entries_file(self) -> Path:
        return self.folder / "entries"

    def entries(self) -> list[list[str]]:
        if not self.entries_file.exists():
            return []
        return [line.split() for line in self.entries_file.read_text().splitlines()]

    def runtime(self) -> Runtime:
        runtime = Runtime(store=ActivityStore())
        Tools(self.entries_file).register(runtime)
        return runtime

    async def tools(
        self, runtime: Runtime | None = None, *, heartbeat_s: float = HEARTBEAT_S
    ) -> tuple[Client, TemporalTools]:
        client = await Client.connect(self.server.address)
        tools = TemporalTools(
            client,
            task_queue=self.task_queue,
            runtime=runtime or self.runtime(),
            heartbeat_s=heartbeat_s,
        )
        return client, tools

    def workers(self) -> Workers:
        return Workers(self.server.address, self.task_queue, self.folder, self.package)


@pytest.fixture
def place(temporal_package: Path, temporal_server: DevServer, tmp_path: Path) -> Place:
    return Place(temporal_server, temporal_package, tmp_path, f"q-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def workers(place: Place) -> Iterator[Workers]:
    started = place.workers()
    try:
        yield started
    finally:
        started.kill_all()


def test_a_call_runs_the_runtime_pipeline_as_an_activity(place: Place) -> None:
    async def main() -> None:
        runtime = place.runtime()
        client, tools = await place.tools(runtime)
        async with worker(client, runtime, task_queue=place.task_queue):
            done = await tools.call("fetch", {"n": 3})
            assert done["status"] == "success"
            assert done["content"] == {"n": 3, "entry": "initial", "note": "ok"}
            invalid = await tools.call("fetch", {"n": "three"})
            assert invalid["status"] == "error" and invalid["code"] == "INVALID_INPUT"
            assert "n" in invalid["message"]
            keyed = await tools.call("fetch", {"n": 4}, call_id="c-key")
            again = await tools.call("fetch", {"n": 4}, call_id="c-key")  # a retry: its result
            assert again == keyed and keyed["content"]["n"] == 4
            other = await tools.call("fetch", {"n": 5}, call_id="c-key")
            assert other["code"] == "DUPLICATE_CALL"
        # the invalid call never ran, the retried one ran once
        assert [e[1:3] for e in place.entries()] == [["initial", "fetch"]] * 2

    run(main())


async def _updates(client: Client, call_id: str) -> list[str]:
    """The update events in the call's workflow history (what was recorded of submissions)."""
    handle = client.get_workflow_handle(workflow_id(call_id))
    kinds = []
    async for event in handle.fetch_history_events():
        if event.event_type in (
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_REJECTED,
        ):
            kinds.append(EventType.Name(event.event_type))
    return kinds


def test_a_suspension_is_a_pending_action_resumed_by_a_submit_update(place: Place) -> None:
    async def main() -> None:
        runtime = place.runtime()
        client, tools = await place.tools(runtime)
        async with worker(client, runtime, task_queue=place.task_queue):
            waiting = await tools.call("sync", {"n": 1, "suspend": True}, call_id="c-suspend")
            assert waiting["status"] == "pending" and waiting["call_id"] == "c-suspend"
            action = waiting["action"]
            assert action["point"] == "approval" and action["payload"] == {"prompt": "sync 1?"}
            # Visibility catches up a moment after the suspension (later under load).
            listed = await _eventually(
                tools.pending, lambda found: any(a["call_id"] == "c-suspend" for a in found)
            )
            mine = [a["action_id"] for a in listed if a["call_id"] == "c-suspend"]
            assert mine == [waiting["action_id"]]
            shown = await TemporalTools(client).action(waiting["action_id"])  # by id alone
            assert shown is not None and shown["submit_schema"]["required"] == ["approved"]
            done = await tools.submit(waiting["action_id"], {"approved": True, "note": "fine"})
            assert done["status"] == "success"
            assert done["content"] == {"n": 1, "entry": "resume", "note": "fine"}
            final = await tools.result("c-suspend")
            assert final["content"] == done["content"]
            again = await tools.submit(waiting["action_id"], {"approved": True})
            assert again["code"] == "ACTION_ALREADY_RESOLVED"
            left = await _eventually(
                tools.pending, lambda found: all(a["call_id"] != "c-suspend" for a in found)
            )
            assert [a for a in left if a["call_id"] == "c-suspend"] == []
        assert [e[1] for e in place.entries()] == ["initial", "resume"]

    run(main())


def test_an_invalid_submit_is_refused_with_nothing_recorded_and_no_reentry(place: Place) -> None:
    async def main() -> None:
        runtime = place.runtime()
        client, tools = await place.tools(runtime)
        async with worker(client, runtime, task_queue=place.task_queue):
            waiting = await tools.call("charge", {"n": 2, "suspend": True}, call_id="c-invalid")
            action_id = waiting["action_id"]
            for bad in ({"approved": "yes"}, {}, [1], "text"):
                refused = await tools.submit(action_id, bad)
                assert refused["status"] == "error" and refused["code"] == "INVALID_SUBMISSION"
                assert "approved" in refused["message"] or "object" in refused["message"]
            assert await _updates(client, "c-invalid") == [
                "EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED"
            ]  # the first step only
            assert [e[1] for e in place.entries()] == ["initial"]  # never re-entered
            still = await tools.action(action_id)
            assert still is not None and still["state"] == "pending"
            done = await tools.submit(action_id, {"approved": False})
            assert done["status"] == "success" and done["content"]["entry"] == "resume"
        assert [e[1] for e in place.entries()] == ["initial", "resume"]

    run(main())


def test_two_tenants_never_see_nor_answer_each_other_s_actions(place: Place) -> None:
    alice = Principal("alice", "t1")
    bob = Principal("bob", "t2")
    operator = Principal("ops", "t0", frozenset({OPERATOR}))

    async def main() -> None:
        runtime = place.runtime()
        client, tools = await place.tools(runtime)
        async with worker(client, runtime, task_queue=place.task_queue):
            mine = await tools.call(
                "sync", {"n": 1, "suspend": True}, context=CallContext(alice), call_id="c-t1"
            )
            theirs = await tools.call(
                "sync", {"n": 2, "suspend": True}, context=CallContext(bob), call_id="c-t2"
            )
            other = TemporalTools(client)  # no cache of action ids: the server's index
            # Visibility catches up a moment after the suspensions (later under load).
            everyone = await _eventually(other.pending, lambda found: len(found) >= 2)
            assert len(everyone) == 2
            seen_by_alice = await other.pending(principal=alice)
            assert [a["action_id"] for a in seen_by_alice] == [mine["action_id"]]
            seen_by_bob = await other.pending(principal=bob)
            assert [a["action_id"] for a in seen_by_bob] == [theirs["action_id"]]
            assert len(await other.pending(principal=operator)) == 2
            assert len(await other.pending()) == 2  # the application itself
            assert await other.action(mine["action_id"], principal=bob) is None
            assert await other.state("c-t1", principal=bob) is None
            refused = await other.submit(mine["action_id"], {"approved": True}, principal=bob)
            assert refused["code"] == "UNKNOWN_ACTION"
            refused = await other.cancel(mine["action_id"], principal=bob)
            assert refused["code"] == "UNKNOWN_ACTION"
            assert await _updates(client, "c-t1") == [
                "EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED"
            ]
            done = await other.submit(mine["action_id"], {"approved": True}, principal=alice)
            assert done["status"] == "success"
            cancelled = await other.cancel(theirs["action_id"], "no", principal=operator)
            assert cancelled["code"] == "CANCELLED"
            assert (await tools.result("c-t2"))["code"] == "CANCELLED"
        assert sorted(e[1] for e in place.entries()) == ["initial", "initial", "resume"]

    run(main())


def test_an_expired_action_settles_as_timeout_by_the_workflow_s_timer(place: Place) -> None:
    async def main() -> None:
        runtime = place.runtime()
        client, tools = await place.tools(runtime)
        async with worker(client, runtime, task_queue=place.task_queue):
            waiting = await tools.call("remind", {"n": 1, "suspend": True}, call_id="c-expire")
            assert waiting["status"] == "pending"
            assert waiting["action"]["expires_at"] is not None
            final = await asyncio.wait_for(tools.result("c-expire"), 30)
            assert final["status"] == "error" and final["code"] == "TIMEOUT"
            late = await tools.submit(waiting["action_id"], {"approved": True})
            assert late["code"] == "ACTION_ALREADY_RESOLVED"
        assert [e[1] for e in place.entries()] == ["initial"]

    run(main())


def test_a_client_tool_call_is_completed_by_its_submitted_output(place: Place) -> None:
    async def main() -> None:
        runtime = place.runtime()
        client, tools = await place.tools(runtime)
        async with worker(client, runtime, task_queue=place.task_queue):
            waiting = await tools.call("ask", {"question": "colour?"}, call_id="c-client")
            assert waiting["status"] == "pending" and waiting["action"]["point"] is None
            refused = await tools.submit(waiting["action_id"], {"answer": 7})
            assert refused["code"] == "INVALID_SUBMISSION"
            done = await tools.submit(waiting["action_id"], {"answer": "blue"})
            assert done["status"] == "success" and done["content"] == {"answer": "blue"}

    run(main())


def test_a_permission_ask_waits_in_the_workflow_and_its_answer_admits_the_call(
    place: Place,
) -> None:
    def policy(request: PermissionRequest) -> Allow | Ask:
        return Ask("May I charge?") if request.name == "charge" else Allow()

    async def main() -> None:
        runtime = Runtime(store=ActivityStore(), permission=policy)
        Tools(place.entries_file).register(runtime)
        client, tools = await place.tools(runtime)
        async with worker(client, runtime, task_queue=place.task_queue):
            asked = await tools.call("charge", {"n": 9}, call_id="c-ask")
            assert asked["status"] == "pending"
            assert place.entries() == []  # not admitted yet
            refused = await tools.submit(asked["action_id"], {"decision": "maybe"})
            assert refused["code"] == "INVALID_SUBMISSION"
            done = await tools.submit(asked["action_id"], {"decision": "approve"})
            assert done["status"] == "success" and done["content"]["n"] == 9
            denied = await tools.call("charge", {"n": 10}, call_id="c-deny")
            no = await tools.submit(denied["action_id"], {"decision": "deny", "message": "no"})
            assert no["code"] == "PERMISSION_DENIED"
        assert [e[:2] for e in place.entries()] == [["c-ask", "initial"]]

    run(main())


def test_hooks_and_lease_fencing_run_in_the_activity_as_in_the_runtime(place: Place) -> None:
    from blade_runtime.core.hooks import HookInput, HookOutput

    async def redact(event: HookInput) -> HookOutput | None:
        output = event.output
        if isinstance(output, dict) and output.get("note") == "secret":
            return HookOutput(modified_output={**output, "note": "[redacted]"})
        return None

    async def main() -> None:
        runtime = Runtime(store=ActivityStore())
        Tools(place.entries_file, note="secret").register(runtime)
        runtime.on("post_tool_use", redact)
        client, tools = await place.tools(runtime)
        async with worker(client, runtime, task_queue=place.task_queue):
            done = await tools.call("fetch", {"n": 1})
            assert done["content"]["note"] == "[redacted]" and "secret" not in str(done)
            waiting = await tools.call("post", {"n": 2, "suspend": True}, call_id="c-fence")
            resumed = await tools.submit(waiting["action_id"], {"approved": True})
            assert resumed["content"]["note"] == "[redacted]"
        # the fenced write ran under the resume's claim: token 2 (1 at the start, +1 at it)
        writes = [e[1] for e in place.entries() if e[0] == "c-fence" and e[1].startswith("write")]
        assert writes == ["write-2"]

    run(main())


def test_cancelling_the_workflow_reaches_the_tool_s_signal(place: Place) -> None:
    async def main() -> None:
        runtime = place.runtime()
        client, tools = await place.tools(runtime)
        async with worker(client, runtime, task_queue=place.task_queue):
            call_id = await tools.start("fetch", {"n": 1, "sleep_ms": 60_000}, call_id="c-cancel")
            await asyncio.to_thread(_wait_for_entry, place, call_id)
            await tools.cancel_call(call_id)
            final = await asyncio.wait_for(tools.result(call_id), 30)
            assert final["status"] == "error" and final["code"] == "CANCELLED"
            # The runtime settled it: ctx.signal fired in the activity, not the workflow alone.
            assert final["message"].endswith("the call was cancelled through Temporal.")
            waiting = await tools.call("sync", {"n": 2, "suspend": True}, call_id="c-cancel-2")
            await tools.cancel_call("c-cancel-2")
            settled = await asyncio.wait_for(tools.result("c-cancel-2"), 30)
            assert settled["code"] == "CANCELLED"
            late = await tools.submit(waiting["action_id"], {"approved": True})
            assert late["code"] == "ACTION_ALREADY_RESOLVED"

    run(main())


def _wait_for_entry(place: Place, call_id: str) -> None:
    place.workers().wait_for_entry(call_id)


@pytest.mark.slow  # worker processes
@pytest.mark.parametrize(("tool", "runs"), [("charge", 1), ("fetch", 2)])
def test_a_worker_killed_mid_activity(place: Place, workers: Workers, tool: str, runs: int) -> None:
    """SIGKILL while the tool runs: a non_idempotent call settles INTERRUPTED and never runs
    again; a pure one runs again on the worker that is left."""
    workers.spawn(hang=(tool,))

    async def main() -> dict[str, Any]:
        _, tools = await place.tools(heartbeat_s=KILLED_HEARTBEAT_S)
        call_id = await tools.start(tool, {"n": 5}, call_id=f"c-kill-{tool}")
        entry = await asyncio.to_thread(workers.wait_for_entry, call_id)
        victim = next(p for p in workers.procs if str(p.pid) == entry[3])
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        await asyncio.to_thread(workers.spawn)  # one that does not hang
        result: dict[str, Any] = await asyncio.wait_for(tools.result(call_id), 60)
        return result

    result = run(main())
    lines = [e for e in workers.entries() if e[0] == f"c-kill-{tool}"]
    assert len(lines) == runs
    if runs == 1:
        assert result["status"] == "error" and result["code"] == "INTERRUPTED"
        assert "not run again" in result["message"]
    else:
        assert result["status"] == "success" and result["content"]["n"] == 5
        assert lines[0][3] != lines[1][3]  # run again, by the other worker


@pytest.mark.slow  # worker processes
def test_exactly_one_resume_of_submits_racing_from_four_worker_processes(
    place: Place, workers: Workers
) -> None:
    """Four worker processes each submit every pending action at once (and run the resumes):
    each action has one winner, the other three get ACTION_ALREADY_RESOLVED, and each call is
    resumed exactly once."""
    workers.spawn(4, submit=True)
    calls = [f"c-race-{n}" for n in range(4)]

    async def start() -> list[str]:
        _, tools = await place.tools()
        waiting = await asyncio.gather(
            *(tools.call("sync", {"n": n, "suspend": True}, call_id=c) for n, c in enumerate(calls))
        )
        return [w["action_id"] for w in waiting]

    action_ids = run(start())
    workers.actions_file.write_text(json.dumps(action_ids))
    workers.go.write_text("go")
    answers = workers.answers()
    for action_id in action_ids:
        mine = [a for a in answers if a["action_id"] == action_id]
        assert len(mine) == 4
        won = [a for a in mine if a["status"] == "success"]
        assert len(won) == 1, mine
        assert (
            sorted(a.get("code") for a in mine if a is not won[0])
            == ["ACTION_ALREADY_RESOLVED"] * 3
        )
    for call_id in calls:
        resumes = [e for e in workers.entries() if e[0] == call_id and e[1] == "resume"]
        assert len(resumes) == 1


@pytest.mark.slow  # worker processes
def test_pending_actions_survive_every_worker_restarting(place: Place, workers: Workers) -> None:
    workers.spawn(2)
    calls = [f"c-survive-{n}" for n in range(3)]

    async def start() -> list[dict[str, Any]]:
        _, tools = await place.tools()
        return list(
            await asyncio.gather(
                *(
                    tools.call("charge", {"n": n, "suspend": True}, call_id=c)
                    for n, c in enumerate(calls)
                )
            )
        )

    waiting = run(start())
    first = {p.pid for p in workers.procs}
    workers.kill_all()
    workers.spawn(2)

    async def finish() -> list[dict[str, Any]]:
        client = await Client.connect(place.server.address)
        tools = TemporalTools(client, task_queue=place.task_queue)  # an operator's: no runtime

        def ours(found: list[dict[str, Any]]) -> list[str]:
            return sorted(a["call_id"] for a in found if a["call_id"] in calls)

        listed = await _eventually(tools.pending, lambda found: ours(found) == calls)
        assert ours(listed) == calls
        return list(
            await asyncio.gather(
                *(
                    tools.submit(a["action_id"], {"approved": True, "note": "later"})
                    for a in waiting
                )
            )
        )

    done = run(finish())
    assert [d["status"] for d in done] == ["success"] * 3
    assert {d["content"]["note"] for d in done} == {"later"}
    resumes = [e for e in workers.entries() if e[1] == "resume"]
    assert sorted(e[0] for e in resumes) == calls
    assert not {int(e[3]) for e in resumes} & first  # the new workers resumed them


def test_the_operators_cli_lists_shows_and_submits_on_temporal(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    from blade_runtime.serving.cli import EXIT_REFUSED, EXIT_STORE, main

    address = place.server.address
    where = ["--temporal", address]

    async def main_() -> None:
        runtime = place.runtime()
        client, tools = await place.tools(runtime)
        async with worker(client, runtime, task_queue=place.task_queue):
            waiting = await tools.call("sync", {"n": 4, "suspend": True}, call_id="c-cli")
            action_id = waiting["action_id"]

            def operator() -> None:
                assert main(["pending", "list", *where]) == 0
                listed = capsys.readouterr().out
                assert action_id in listed and "sync.approval" in listed and "call=c-cli" in listed
                assert main(["pending", "show", action_id, *where]) == 0
                shown = json.loads(capsys.readouterr().out)
                assert shown["payload"] == {"prompt": "sync 4?"} and shown["state"] == "pending"
                assert main(["pending", "submit", action_id, '{"approved": 1}', *where]) == (
                    EXIT_REFUSED
                )
                refused = capsys.readouterr().err
                assert refused.startswith("error: Invalid submission") and refused.count("\n") == 1
                assert main(["pending", "submit", action_id, '{"approved": true}', *where]) == 0
                assert '"entry": "resume"' in capsys.readouterr().out
                assert main(["pending", "submit", action_id, '{"approved": true}', *where]) == (
                    EXIT_REFUSED
                )
                assert "already" in capsys.readouterr().err
                assert main(["pending", "show", "act_nope", *where]) == EXIT_REFUSED
                assert capsys.readouterr().err == "error: no pending action 'act_nope'\n"
                # nothing pending: said where a person reads it, stdout left empty for scripts
                assert main(["pending", "list", "--tool", "nothing_here", *where]) == 0
                assert capsys.readouterr() == ("", "no pending actions\n")
                for both_or_neither in ([], ["--store", "x.db", *where]):
                    with pytest.raises(SystemExit) as usage:
                        main(["pending", "list", *both_or_neither])
                    assert usage.value.code == 2
                    assert "--store" in capsys.readouterr().err
                unreachable = ["--temporal", f"127.0.0.1:{free_port()}"]
                assert main(["pending", "list", *unreachable]) == EXIT_STORE
                err = capsys.readouterr().err
                assert err.startswith("error: Temporal at") and err.count("\n") == 1

            await asyncio.to_thread(operator)
            other = await tools.call("sync", {"n": 5, "suspend": True}, call_id="c-cli-2")
            cancel = ["pending", "cancel", other["action_id"], "--reason", "duplicate", *where]
            assert await asyncio.to_thread(main, cancel) == 0
            assert "CANCELLED" in capsys.readouterr().out
            settled = await tools.result("c-cli-2")
            assert settled["code"] == "CANCELLED" and "duplicate" in settled["message"]
        assert [e[1] for e in place.entries()] == ["initial", "resume", "initial"]

    run(main_())


def test_the_http_api_serves_calls_and_pending_actions_from_temporal(place: Place) -> None:
    import httpx
    from starlette.requests import Request

    from blade_runtime.serving.http.temporal import create_temporal_app

    people = {"alice": Principal("alice", "t1"), "bob": Principal("bob", "t2")}

    def authenticate(request: Request) -> Principal | None:
        return people.get(request.headers.get("x-user", ""))

    async def main() -> None:
        runtime = place.runtime()
        client, tools = await place.tools(runtime)
        app = create_temporal_app(tools, authenticate)
        transport = httpx.ASGITransport(app=app)
        async with (
            worker(client, runtime, task_queue=place.task_queue),
            httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http,
        ):
            alice, bob = {"x-user": "alice"}, {"x-user": "bob"}
            assert (await http.get("/v1/actions")).status_code == 401
            made = await http.post(
                "/v1/tools/sync/calls",
                json={"n": 7, "suspend": True},
                headers={**alice, "idempotency-key": "c-http"},
            )
            assert made.status_code == 202 and made.json()["status"] == "pending"
            action_id = made.json()["action"]["action_id"]
            listed = (
                await _eventually(
                    lambda: http.get("/v1/actions", headers=alice),
                    lambda answer: answer.json()["actions"],
                )
            ).json()["actions"]
            assert [a["action_id"] for a in listed] == [action_id]
            assert (await http.get("/v1/actions", headers=bob)).json() == {
                "actions": [],
                "next": None,
            }
            assert (await http.get(f"/v1/actions/{action_id}", headers=bob)).status_code == 404
            assert (await http.get("/v1/calls/c-http", headers=bob)).status_code == 404
            stolen = await http.post(
                f"/v1/actions/{action_id}/submit", json={"approved": True}, headers=bob
            )
            assert stolen.status_code == 404 and stolen.json()["code"] == "UNKNOWN_ACTION"
            bad = await http.post(
                f"/v1/actions/{action_id}/submit", json={"approved": "y"}, headers=alice
            )
            assert bad.status_code == 422 and bad.json()["code"] == "INVALID_SUBMISSION"
            done = await http.post(
                f"/v1/actions/{action_id}/submit", json={"approved": True}, headers=alice
            )
            assert done.status_code == 200 and done.json()["content"]["entry"] == "resume"
            late = await http.post(
                f"/v1/actions/{action_id}/submit", json={"approved": True}, headers=alice
            )
            assert late.status_code == 409 and late.json()["code"] == "ACTION_ALREADY_RESOLVED"
            shown = (await http.get("/v1/calls/c-http", headers=alice)).json()
            assert shown["result"]["status"] == "success"
            wrong = await http.post("/v1/tools/sync/calls", json={"n": "x"}, headers=alice)
            assert wrong.status_code == 422 and wrong.json()["code"] == "INVALID_INPUT"
            missing = await http.post("/v1/tools/nope/calls", json={}, headers=alice)
            assert missing.status_code == 404
        assert [e[1] for e in place.entries()] == ["initial", "resume"]

    run(main())


def test_the_typed_client_calls_and_answers_through_temporal(place: Place) -> None:
    import importlib

    from blade_runtime.temporal import TemporalTransport

    package = importlib.import_module("blade_workers.client")
    charge_v1 = importlib.import_module("blade_workers.work.charge_v1")
    fetch_v1 = importlib.import_module("blade_workers.work.fetch_v1")
    alice, bob = Principal("alice", "t1"), Principal("bob", "t2")

    async def main() -> None:
        runtime = place.runtime()
        client, tools = await place.tools(runtime)
        async with worker(client, runtime, task_queue=place.task_queue):
            typed = package.Client(TemporalTransport(tools, alice))
            done = await typed.fetch(fetch_v1.FetchInput(n=2), call_id="c-typed")
            assert done.status == "success" and done.output.n == 2
            waiting = await typed.charge(charge_v1.ChargeInput(n=3, suspend=True), run_id="r")
            assert waiting.status == "pending" and waiting.action.input.prompt == "charge 3?"
            listed = await _eventually(
                lambda: asyncio.to_thread(typed.pending), lambda found: len(found) > 0
            )
            assert [a.action_id for a in listed] == [waiting.action.action_id]
            assert (
                await asyncio.to_thread(package.Client(TemporalTransport(tools, bob)).pending) == []
            )
            resumed = await waiting.action.submit(
                charge_v1.ChargeApprovalResume(approved=True, note="typed")
            )
            assert resumed.status == "success" and resumed.output.note == "typed"
            settled = await _eventually(lambda: asyncio.to_thread(typed.pending), lambda f: not f)
            assert settled == []
            assert typed.pending() == []  # from inside the running loop too

    run(main())


def test_tool_data_written_before_and_after_a_suspension_stays_with_the_call(
    place: Place,
) -> None:
    import importlib

    jot = importlib.import_module("blade_workers.work.jot_v1")

    async def jotting(ctx: Any) -> Any:
        if isinstance(ctx.entry, ResumeEntry):
            await ctx.data.write("lines", jot.JotLinesData(text=ctx.entry.payload.text), id="b")
            return jot.JotOutput(lines=len(await ctx.data.list("lines")))
        await ctx.data.write("lines", jot.JotLinesData(text=ctx.input.text), id="a")
        ctx.suspend("more", jot.JotMoreSuspend(asked="more?"))

    async def main() -> None:
        runtime = place.runtime()
        runtime.register(jot.SPEC, jotting)
        client, tools = await place.tools(runtime)
        async with worker(client, runtime, task_queue=place.task_queue):
            waiting = await tools.call(
                "jot", {"text": "one"}, call_id="c-jot", context=CallContext(Principal("a", "t1"))
            )
            assert waiting["status"] == "pending"
            held = await tools.data("c-jot")
            assert held is not None and [(d["item_id"], d["value"]) for d in held] == [
                ("a", {"text": "one"})
            ]
            assert await tools.data("c-jot", principal=Principal("b", "t2")) is None
            done = await tools.submit(waiting["action_id"], {"text": "two"})
            assert done["status"] == "success" and done["content"] == {"lines": 2}
            kept = await tools.data("c-jot")
            assert kept is not None and [d["value"]["text"] for d in kept] == ["one", "two"]

    run(main())


async def _eventually(read: Any, check: Any, wait_s: float = 30.0) -> Any:
    """``await read()`` until ``check`` holds of it: Temporal's visibility store catches up with
    a workflow's search attributes and memo a moment after it upserts them."""
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        found = await read()
        if check(found) or asyncio.get_running_loop().time() > deadline:
            return found
        await asyncio.sleep(0.1)


def _ids(actions: list[dict[str, Any]]) -> list[str]:
    return sorted(a["action_id"] for a in actions)


def test_a_listing_reads_temporal_s_visibility_and_a_gone_worker_hides_nothing(
    place: Place, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each waiting call keeps its action's summary where a visibility query finds it: a
    listing (TemporalTools, the CLI) pages over them with Temporal's page token and asks no
    worker, so calls on a task queue whose worker is gone are listed like any other."""
    from blade_runtime.core.store import BadCursor
    from blade_runtime.serving.cli import main

    # tenants of this test alone: the dev server is shared by the session's tests
    t1, t2 = f"t1-{place.task_queue}", f"t2-{place.task_queue}"
    alice, carol, bob = Principal("alice", t1), Principal("carol", t1), Principal("bob", t2)
    dave = Principal("dave", t1)
    gone_queue = f"{place.task_queue}-gone"

    async def main_() -> None:
        runtime = place.runtime()
        client, tools = await place.tools(runtime)
        gone_tools = TemporalTools(client, task_queue=gone_queue, runtime=runtime)
        async with worker(client, place.runtime(), task_queue=gone_queue):
            on_gone = await gone_tools.call(
                "sync", {"n": 9, "suspend": True}, context=CallContext(bob), run_id="r-gone"
            )
        # that queue's only worker stopped: nothing answers a query of that call any more
        async with worker(client, runtime, task_queue=place.task_queue):
            alices = [
                await tools.call("sync", {"n": n, "suspend": True}, context=CallContext(alice))
                for n in range(2)
            ]
            carols = await tools.call(
                "charge", {"n": 5, "suspend": True}, context=CallContext(carol)
            )
            large = await tools.call(
                "ask", {"question": "x" * 10_000}, run_id="r-large", context=CallContext(dave)
            )
            every = _ids([*alices, carols, on_gone, large])
            listing = TemporalTools(client)  # an operator's, with no memory of these calls

            def ours(found: list[dict[str, Any]]) -> list[str]:
                return _ids([a for a in found if a["tenant"] in (t1, t2)])

            listed = await _eventually(listing.pending, lambda found: ours(found) == every)
            assert ours(listed) == every
            by_id = {a["action_id"]: a for a in listed}
            gone = by_id[on_gone["action_id"]]
            assert (gone["name"], gone["point"], gone["tenant"]) == ("sync", "approval", t2)
            assert gone["principal"] == "bob" and gone["payload"] == {"prompt": "sync 9?"}
            assert gone["submit_schema"]["required"] == ["approved"]
            # a payload over the summary's bound is left out of the listing, shown whole by id
            assert by_id[large["action_id"]]["payload"] is None
            assert by_id[large["action_id"]]["payload_bytes"] > 10_000
            shown = await listing.action(large["action_id"])
            assert shown is not None and shown["payload"] == {"question": "x" * 10_000}

            # pages of one: every action once, in Temporal's order, then no cursor
            paged: list[str] = []
            cursor = None
            for _ in range(10):
                page = await listing.pending_page(limit=1, cursor=cursor)
                assert len(page.items) <= 1
                paged += [a["action_id"] for a in page.items]
                cursor = page.next
                if cursor is None:
                    break
            assert len(paged) == len(set(paged))  # each once
            assert sorted(set(paged) & set(every)) == every
            for bad in ("not a cursor!", "", "AAAA"):
                with pytest.raises(BadCursor):
                    await listing.pending_page(cursor=bad)

            # each principal its own: the tenant, then the principal the call was made for
            assert _ids(await listing.pending(principal=alice)) == _ids(alices)
            assert _ids(await listing.pending(principal=carol)) == _ids([carols])
            assert _ids(await listing.pending(principal=bob)) == _ids([on_gone])
            assert ours(await listing.pending(run_id="r-gone")) == _ids([on_gone])
            assert ours(await listing.pending(tool="charge")) == _ids([carols])
            assert (await listing.pending_page(tenant=t2)).items[0]["call_id"] == on_gone["call_id"]

            def operator() -> None:
                where = ["--temporal", place.server.address]
                assert main(["pending", "list", "--json", "--limit", "3", *where]) == 0
                out, err = capsys.readouterr()
                first = [a["action_id"] for a in json.loads(out)]
                assert len(first) == 3 and "more: add --after" in err
                after = err.split("--after ")[1].split()[0]
                assert main(["pending", "list", "--json", "--after", after, *where]) == 0
                rest = [a["action_id"] for a in json.loads(capsys.readouterr().out)]
                assert set(every) <= set(first + rest)
                assert main(["pending", "list", "--tenant", t2, *where]) == 0
                lines = capsys.readouterr().out.splitlines()
                assert len(lines) == 1 and on_gone["action_id"] in lines[0]
                assert main(["pending", "list", "--after", "nope!", *where]) == 2
                assert capsys.readouterr().err.startswith("error: --after: not a cursor")

            await asyncio.to_thread(operator)
            # answered: it leaves the listing
            await tools.submit(alices[0]["action_id"], {"approved": True}, principal=alice)
            left = await _eventually(
                lambda: listing.pending(principal=alice),
                lambda found: _ids(found) == _ids(alices[1:]),
            )
            assert _ids(left) == _ids(alices[1:])

    run(main_())


_VARYING = {"call_id", "action_id", "suspended_at", "started_at", "resolved_at", "message"}


def _shape(body: Any) -> Any:
    """A response body with what differs between two runs of the same case (ids, times, the
    wording of an error) left out: what both apps must answer alike."""
    if isinstance(body, dict):
        return {k: "<varies>" if k in _VARYING else _shape(v) for k, v in body.items()}
    if isinstance(body, list):
        return [_shape(item) for item in body]
    return body


async def _conformance(http: Any, later: Any) -> list[tuple[str, int, Any]]:
    """The API cases both apps answer: (case, status, body shape) each. ``later(read, check)``
    waits for a listing to catch up (Temporal's visibility)."""
    alice, bob = {"x-user": "alice"}, {"x-user": "bob"}
    seen: list[tuple[str, int, Any]] = []

    def note(case: str, answer: Any) -> Any:
        body = answer.json() if answer.content else None
        seen.append((case, answer.status_code, _shape(body)))
        return body

    note("tools", await http.get("/v1/tools", headers=alice))
    note("no principal", await http.get("/v1/actions"))
    note("success", await http.post("/v1/tools/fetch/calls", json={"n": 2}, headers=alice))
    note("invalid input", await http.post("/v1/tools/fetch/calls", json={"n": "x"}, headers=alice))
    note("no tool", await http.post("/v1/tools/nope/calls", json={}, headers=alice))
    note(
        "not json",
        await http.post(
            "/v1/tools/fetch/calls",
            content=b"{",
            headers={**alice, "content-type": "application/json"},
        ),
    )
    waiting = note(
        "pending",
        await http.post(
            "/v1/tools/sync/calls?run_id=r1",
            json={"n": 7, "suspend": True},
            headers={**alice, "idempotency-key": "c-conform"},
        ),
    )
    action_id = waiting["action"]["action_id"]
    other = note(
        "pending 2",
        await http.post("/v1/tools/sync/calls", json={"n": 8, "suspend": True}, headers=alice),
    )

    async def listed() -> Any:
        return (await http.get("/v1/actions?run_id=r1", headers=alice)).json()

    await later(listed, lambda body: len(body["actions"]) == 1)
    note("list", await http.get("/v1/actions?run_id=r1", headers=alice))
    note("list other tenant", await http.get("/v1/actions", headers=bob))
    note("list bad limit", await http.get("/v1/actions?limit=0", headers=alice))
    note("list bad cursor", await http.get("/v1/actions?cursor=nope!", headers=alice))
    note("show", await http.get(f"/v1/actions/{action_id}", headers=alice))
    note("show other tenant", await http.get(f"/v1/actions/{action_id}", headers=bob))
    note("call while waiting", await http.get("/v1/calls/c-conform", headers=alice))
    note("call other tenant", await http.get("/v1/calls/c-conform", headers=bob))
    note(
        "submit other tenant",
        await http.post(f"/v1/actions/{action_id}/submit", json={"approved": True}, headers=bob),
    )
    note(
        "submit invalid",
        await http.post(f"/v1/actions/{action_id}/submit", json={"approved": "y"}, headers=alice),
    )
    note(
        "submit",
        await http.post(
            f"/v1/actions/{action_id}/submit", json={"approved": True, "note": "n"}, headers=alice
        ),
    )
    note(
        "submit again",
        await http.post(f"/v1/actions/{action_id}/submit", json={"approved": True}, headers=alice),
    )
    note("call settled", await http.get("/v1/calls/c-conform", headers=alice))
    note("call unknown", await http.get("/v1/calls/c-none", headers=alice))
    other_id = other["action"]["action_id"]
    note(
        "cancel bad body",
        await http.post(f"/v1/actions/{other_id}/cancel", json=[1], headers=alice),
    )
    note(
        "cancel",
        await http.post(f"/v1/actions/{other_id}/cancel", json={"reason": "dup"}, headers=alice),
    )
    note("no route", await http.get("/v1/nothing", headers=alice))
    return seen


def test_the_temporal_app_answers_the_api_s_cases_as_create_app_does(place: Place) -> None:
    """The same API cases against create_app (a runtime on a store) and create_temporal_app:
    the same statuses and bodies, case by case; and the typed HttpTransport client works
    against the Temporal app."""
    import importlib

    import httpx
    from starlette.requests import Request

    from blade_runtime.client.http import HttpTransport
    from blade_runtime.serving.http import create_app
    from blade_runtime.serving.http.temporal import create_temporal_app

    # tenants of this test alone: the dev server is shared by the session's tests
    t1, t2 = f"t1-{place.task_queue}", f"t2-{place.task_queue}"
    people = {"alice": Principal("alice", t1), "bob": Principal("bob", t2)}

    def authenticate(request: Request) -> Principal | None:
        return people.get(request.headers.get("x-user", ""))

    async def at_once(read: Any, check: Any) -> Any:
        return await read()

    async def on(app: Any, later: Any) -> list[tuple[str, int, Any]]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await _conformance(http, later)

    async def main() -> None:
        store_runtime = Runtime()
        Tools(place.folder / "store-entries").register(store_runtime)
        on_store = await on(create_app(store_runtime, authenticate=authenticate), at_once)
        runtime = place.runtime()
        client, tools = await place.tools(runtime)
        async with worker(client, runtime, task_queue=place.task_queue):
            temporal_app = create_temporal_app(tools, authenticate)
            on_temporal = await on(temporal_app, _eventually)
            assert [c for c, _, _ in on_temporal] == [c for c, _, _ in on_store]
            for (case, status, body), (_, t_status, t_body) in zip(
                on_store, on_temporal, strict=True
            ):
                assert (case, t_status) == (case, status)
                assert (case, t_body) == (case, body)

            # the typed client over HTTP, against the Temporal app
            package = importlib.import_module("blade_workers.client")
            charge_v1 = importlib.import_module("blade_workers.work.charge_v1")
            transport = HttpTransport(
                "http://127.0.0.1",
                headers={"x-user": "alice"},
                transport=httpx.ASGITransport(app=temporal_app),
            )
            async with transport:
                typed = package.Client(transport)
                waiting = await typed.charge(charge_v1.ChargeInput(n=3, suspend=True))
                assert waiting.status == "pending" and waiting.action.input.prompt == "charge 3?"
                done = await waiting.action.submit(
                    charge_v1.ChargeApprovalResume(approved=True, note="typed")
                )
                assert done.status == "success" and done.output.note == "typed"

    run(main())


@pytest.mark.slow  # CLI processes
def test_the_cli_on_temporal_always_exits_with_its_own_code(place: Place) -> None:
    """``blade-runtime pending ... --temporal`` as a process, run over and over: every exit is
    0, 1 or 3 as documented, never the SDK's abort at interpreter exit (134, 139)."""
    import subprocess
    import sys
    from pathlib import Path as FilePath

    command = str(FilePath(sys.executable).parent / "blade-runtime")
    where = ["--temporal", place.server.address]
    cases = [
        (["pending", "list", *where], 0),
        (["pending", "show", "act_nope", *where], 1),
        (["pending", "submit", "act_nope", "{}", *where], 1),
        (["pending", "list", "--temporal", f"127.0.0.1:{free_port()}"], 3),
    ]
    exits = []
    for round_ in range(6):
        for argv, expected in cases:
            done = subprocess.run([command, *argv], capture_output=True, text=True, timeout=120)
            exits.append((argv[1], round_, done.returncode, expected))
            assert "Fatal Python error" not in done.stderr, done.stderr
    assert [(verb, n, code) for verb, n, code, _ in exits] == [
        (verb, n, expected) for verb, n, _, expected in exits
    ]


def test_a_call_on_temporal_is_one_trace_with_the_sdks_tracing_interceptor(place: Place) -> None:
    """Temporal's own OpenTelemetry interceptor carries the caller's trace through the workflow
    to the activity; the runtime's span of the call (blade_runtime.otel) is a child there."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from temporalio.contrib.opentelemetry import TracingInterceptor

    from blade_runtime.otel import Telemetry

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracer = provider.get_tracer("agent")

    async def main() -> Any:
        runtime = place.runtime()
        runtime.observe(Telemetry(tracer_provider=provider))
        client = await Client.connect(
            place.server.address, interceptors=[TracingInterceptor(tracer)]
        )
        tools = TemporalTools(
            client, task_queue=place.task_queue, runtime=runtime, heartbeat_s=HEARTBEAT_S
        )
        async with worker(client, runtime, task_queue=place.task_queue):
            with tracer.start_as_current_span("agent turn") as turn:
                done = await tools.call("fetch", {"n": 3}, call_id="c-traced")
        assert done["status"] == "success"
        return turn

    turn = run(main())
    finished = spans.get_finished_spans()
    [tool] = [s for s in finished if s.name == "execute_tool fetch"]
    assert tool.context.trace_id == turn.context.trace_id
    assert tool.attributes["gen_ai.tool.call.id"] == "c-traced"
    parent = {s.context.span_id: s for s in finished}[tool.parent.span_id]  # type: ignore[union-attr]
    assert parent.name.startswith("RunActivity")  # the activity Temporal's interceptor traced
