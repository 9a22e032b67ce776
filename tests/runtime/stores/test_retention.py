"""A year of traffic on one store, as an operator meets it: listings a page at a time from the
command line, settled history pruned by a policy (the CLI's prune, ``Runtime.prune`` and the
recovery loop's sweep), and what a prune gives back to the file system."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from records import a_call, ev, suspended

from blade_runtime import Retention, Runtime
from blade_runtime.core.records import Records, after_of, cursor_of
from blade_runtime.core.retention import duration_s
from blade_runtime.core.store import BadCursor, Store
from blade_runtime.serving import cli
from blade_runtime.stores.sqlite import SQLiteStore


def _settled(store: Store, count: int, run_id: str = "history") -> list[str]:
    """``count`` calls begun and settled (each with a 10 KB result)."""
    ids = []
    for _ in range(count):
        call = a_call(run_id=run_id)
        store.begin(call, ev(call, "started"))
        store.settle(call.claim, {"blob": "x" * 10_000}, ev(call, "result"))
        ids.append(call.call_id)
    return ids


def test_the_cli_lists_a_page_at_a_time_and_names_the_next(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    store = SQLiteStore(tmp_path / "ops.db")
    acme = [suspended(store, tenant="acme")[1].action_id for _ in range(5)]
    suspended(store, tenant="globex")
    store.close()

    assert cli.main(["pending", "list", "--store", url, "--tenant", "acme", "--limit", "2"]) == 0
    out, err = capsys.readouterr()
    assert [line.split()[0] for line in out.splitlines()] == acme[:2]
    cursor = err.strip().split("--after ")[1].split()[0]
    seen = acme[:2]
    while cursor:
        argv = ["pending", "list", "--store", url, "--tenant", "acme", "--limit", "2"]
        assert cli.main([*argv, "--after", cursor]) == 0
        out, err = capsys.readouterr()
        seen += [line.split()[0] for line in out.splitlines()]
        cursor = err.strip().split("--after ")[1].split()[0] if "--after" in err else ""
    assert seen == acme  # every action of the tenant once, oldest first; none of another's

    assert cli.main(["pending", "list", "--store", url, "--after", "not a cursor!"]) == 2
    assert "error: --after:" in capsys.readouterr().err
    other = cursor_of(acme[0])
    assert (
        cli.main(["pending", "list", "--store", url, "--tenant", "globex", "--after", other]) == 2
    )


def test_the_cli_prunes_settled_history_and_only_that(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "prune.db"
    url = f"sqlite:///{path}"
    store = SQLiteStore(path)
    old = _settled(store, 600)  # more than one batch
    waiting, action = suspended(store)
    store.close()

    assert cli.main(["prune", "--store", url]) == 2
    assert "give --older-than AGE, --keep N, or both" in capsys.readouterr().err
    assert cli.main(["prune", "--store", url, "--older-than", "soon"]) == 2
    assert "is not a duration" in capsys.readouterr().err
    assert cli.main(["prune", "--store", str(tmp_path / "none.db"), "--keep", "0"]) == 3

    assert cli.main(["prune", "--store", url, "--keep", "100", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("would remove 500 settled calls, 0 actions")
    size = path.stat().st_size
    assert cli.main(["prune", "--store", url, "--older-than", "0s"]) == 0
    said = capsys.readouterr().out
    assert said.startswith("removed 600 settled calls, 0 actions, 0 ToolData items, 1200 events")
    store = SQLiteStore(path)
    try:
        assert all(store.call(call_id) is None for call_id in old)
        assert store.call(waiting.call_id) is not None  # waiting work stays
        assert store.action(action.action_id) is not None
    finally:
        store.close()
    assert path.stat().st_size < size / 2  # a new file vacuums as it prunes: the space is back


def test_a_runtime_s_retention_is_swept_by_its_recovery_loop(tmp_path: Path) -> None:
    async def scenario() -> tuple[Any, ...]:
        store = SQLiteStore(tmp_path / "loop.db")
        runtime = Runtime(store=store, retention=Retention(keep=3, every_s=0.05))
        kept = _settled(store, 10)[-3:]
        counted = await runtime.prune(dry_run=True)
        loop = asyncio.create_task(runtime.run_recovery(interval_s=0.02))
        try:
            for _ in range(200):
                if len(await runtime.records.calls()) == 3:
                    break
                await asyncio.sleep(0.02)
            left = [c.call_id for c in await runtime.records.calls()]
        finally:
            loop.cancel()
            await runtime.close()
            store.close()
        return counted, left, kept

    counted, left, kept = asyncio.run(scenario())
    assert counted.calls == 7 and counted.events == 14
    assert left == kept  # the newest three


def test_a_policy_and_a_cursor_are_checked_before_anything_is_read() -> None:
    with pytest.raises(ValueError, match="keeps everything"):
        Retention()
    with pytest.raises(ValueError, match="at least 0"):
        Retention(older_than_s=-1)
    assert duration_s("30d") == 30 * 86400 and duration_s("1.5h") == 5400 and duration_s("9") == 9
    with pytest.raises(ValueError, match="not a duration"):
        duration_s("a week")
    assert after_of(cursor_of("act_\u00e9t\u00e9")) == "act_\u00e9t\u00e9"
    for bad in ("***", "\udc80"):
        with pytest.raises(BadCursor):
            after_of(bad)

    async def page() -> None:
        await Records(SQLiteStore(":memory:")).actions_page(cursor="%%%")

    with pytest.raises(BadCursor):
        asyncio.run(page())
