"""``blade-codegen import --from mcp --server``: a live MCP server's tools imported (a command
over stdio, a streamable HTTP URL with headers), and ``--check`` saying whether the specs still
match the server, with check's exit codes, writing nothing. The server is the bridge's fixture
(``tests/mcp_remote_server.py``, the MCP SDK's own server); its next release changes one tool
incompatibly, one compatibly, and drops one."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from conftest import run_cli

SERVER = Path(__file__).resolve().parents[1] / "mcp_remote_server.py"


def command(variant: str = "") -> str:
    return shlex.join(["env", f"FIXTURE_VARIANT={variant}", sys.executable, str(SERVER), "stdio"])


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text("utf-8") for p in sorted(folder.rglob("*"))
            if p.is_file()}  # fmt: skip


def test_a_live_server_is_imported_and_checked_for_drift(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    base = ["import", "--from", "mcp", "--namespace", "fixture", "--out", str(specs)]
    imported = run_cli(*base, "--server", command())
    assert imported.returncode == 0, imported.stderr
    assert (specs / "fixture" / "forecast.v1.json").exists()
    written = snapshot(specs)

    same = run_cli(*base, "--server", command(), "--check")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "compatible" in same.stderr and same.stdout == ""

    changed = run_cli(*base, "--server", command("changed"), "--check")
    assert changed.returncode == 1, changed.stdout + changed.stderr
    lines = changed.stdout.splitlines()
    assert any(
        "forecast.v1.json: /inputSchema/properties/units: REQUIRED" in line
        and line.endswith("(breaking)")
        for line in lines
    ), lines
    assert any("gone.v1.json" in line and "no longer lists gone" in line for line in lines), lines
    assert any("echo.v1.json" in line and line.endswith("(compatible)") for line in lines), lines
    assert "2 breaking change(s)" in changed.stderr
    assert snapshot(specs) == written  # --check writes nothing


def test_a_server_that_cannot_be_read_is_one_line_and_exit_3(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-server"
    base = ["import", "--from", "mcp", "--namespace", "fixture", "--out", str(tmp_path / "s")]
    done = run_cli(*base, "--server", str(missing))
    assert done.returncode == 3
    assert done.stderr.count("\n") == 1 and "cannot read the MCP server" in done.stderr
    assert not (tmp_path / "s").exists()

    both = run_cli(*base, "--server", str(missing), str(tmp_path / "tools.json"))
    assert both.returncode == 2 and "FILE or --server" in both.stderr
    headers = run_cli(*base, "--server", "some-command", "--header", "A: b")
    assert headers.returncode == 3 and "--header goes with a server URL" in headers.stderr


def test_a_live_server_over_http_with_headers(tmp_path: Path) -> None:
    from runtime.remote.test_mcp_bridge import http_server

    specs = tmp_path / "specs"
    with http_server() as url:
        done = run_cli(
            *["import", "--from", "mcp", "--namespace", "fixture", "--out", str(specs)],
            *["--server", url, "--header", "Authorization: Bearer t0ken"],
        )
    assert done.returncode == 0, done.stderr
    assert "t0ken" not in done.stdout + done.stderr
    assert (specs / "fixture" / "picture.v1.json").exists()
