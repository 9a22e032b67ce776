"""The official MCP conformance suite (``@modelcontextprotocol/conformance``, on the Node 22 of
npm's ``node`` package, both installed by ``npm ci --prefix tests/conformance``: nothing is
fetched here) against ``blade-runtime mcp`` serving its fixture tools
(``tests/conformance/fixture_tools.py``): over streamable HTTP at both protocol eras, every
scenario but those ``tests/conformance/expected-failures.*.yml`` list with their reasons, and
over stdio (through ``stdio_bridge.py``, the suite speaking HTTP only) every tool scenario of
protocol 2026-07-28. A suite that is not installed fails these tests; it never skips them."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[2]
SUITE = TESTS / "conformance"
BIN = Path(sys.executable).parent
NODE = SUITE / "node_modules" / ".bin" / "node"
CONFORMANCE = SUITE / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
sys.path.insert(0, str(SUITE))
import fixture_tools  # noqa: E402

TOOL_SCENARIOS = (
    "tools-list",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-error",
    "tools-call-with-progress",
    "json-schema-2020-12",
    "input-required-result-basic-elicitation",
    "input-required-result-request-state",
    "input-required-result-multi-round",
    "input-required-result-missing-input-response",
    "input-required-result-result-type",
    "input-required-result-tampered-state",
    "input-required-result-ignore-extra-params",
    "input-required-result-validate-input",
)
"""The suite's tool scenarios of protocol 2026-07-28 that hold nothing of HTTP's own."""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (NODE.exists() and CONFORMANCE.exists()):
        pytest.fail(
            "the MCP conformance suite is not installed: run `npm ci --prefix tests/conformance` "
            "(.ci/run does)"
        )
    return fixture_tools.build_package(tmp_path_factory.mktemp("conformance"))


def _env(built: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(built), str(SUITE), env.get("PYTHONPATH", "")])
    return env


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@contextlib.contextmanager
def _serving(command: list[str], env: dict[str, str], log: Path, ready: str) -> Iterator[None]:
    """``command`` running, its stderr in ``log``, once ``ready`` is in it (or its port takes
    connections); stopped with SIGTERM after."""
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stderr=out, stdout=subprocess.DEVNULL)
    try:
        port = int(ready.rsplit(":", 1)[1])
        for _ in range(1200):  # a minute, on a busy machine
            assert process.poll() is None, log.read_text()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.05)
        yield
    finally:
        process.terminate()
        process.wait(timeout=60)


def _suite(url: str, *args: str, output: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(NODE), str(CONFORMANCE), "server", "--url", url, *args, "-o", str(output)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _mcp(built: Path, tmp: Path, *args: str) -> list[str]:
    return [
        str(BIN / "blade-runtime"),
        "mcp",
        "fixture_tools:make_runtime",
        "--store",
        str(tmp / "blade.db"),
        *args,
    ]


@pytest.mark.parametrize(
    ("version", "sessions"), [("2026-07-28", False), ("2025-11-25", True)], ids=["2026", "2025"]
)
def test_the_suite_over_streamable_http(
    built: Path, tmp_path: Path, version: str, sessions: bool
) -> None:
    """Every scenario of the protocol version: the tool scenarios pass (the 2025 era's
    elicitation within the request with ``--sessions``), and only what the baseline lists with
    its reason fails (resources, prompts, completion, sampling, roots, SSE polling); an entry
    that passes fails the run too (the suite calls it stale)."""
    port = _free_port()
    command = _mcp(built, tmp_path, "--http", f"127.0.0.1:{port}")
    log = tmp_path / "server.log"
    with _serving(command + ["--sessions"] * sessions, _env(built), log, f"127.0.0.1:{port}"):
        done = _suite(
            f"http://127.0.0.1:{port}/mcp",
            "--suite",
            "all",
            "--spec-version",
            version,
            "--expected-failures",
            str(SUITE / f"expected-failures.{version}.yml"),
            output=tmp_path / "results",
        )
    summary = done.stdout[done.stdout.find("=== SUMMARY ===") :]
    assert done.returncode == 0, summary + done.stderr[-4000:]
    assert "Baseline check passed" in done.stdout, summary
    for scenario in ("tools-call-with-progress", "tools-call-audio", "json-schema-2020-12"):
        assert f"✓ {scenario}:" in summary, summary
    assert "Traceback" not in log.read_text(), log.read_text()  # no fixture tool broke


def test_the_tool_scenarios_over_stdio(built: Path, tmp_path: Path) -> None:
    """The suite's tool scenarios of protocol 2026-07-28 against ``blade-runtime mcp`` on stdio,
    each passing with no warning: content blocks, errors, progress, JSON Schema 2020-12, and the
    input-required flow (the input's key, signed request state refused when tampered with,
    several rounds)."""
    port = _free_port()
    bridge = [sys.executable, str(SUITE / "stdio_bridge.py"), str(port), "--"]
    log = tmp_path / "bridge.log"
    failed: dict[str, str] = {}
    with _serving(bridge + _mcp(built, tmp_path), _env(built), log, f"127.0.0.1:{port}"):
        for scenario in TOOL_SCENARIOS:
            done = _suite(
                f"http://127.0.0.1:{port}/mcp",
                "--scenario",
                scenario,
                "--spec-version",
                "2026-07-28",
                output=tmp_path / "results",
            )
            last = (done.stdout + done.stderr).strip().splitlines()[-1:]
            if done.returncode != 0 or not last or " 0 failed, 0 warnings" not in last[0]:
                failed[scenario] = done.stdout[-2000:] + done.stderr[-2000:]
    assert not failed, failed
    assert "Traceback" not in log.read_text(), log.read_text()
