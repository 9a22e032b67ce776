"""Shared helpers: build spec trees into temporary folders and type-check the result."""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# tests/postgres.py: the PostgreSQL server fixtures; tests/browser_support.py: Chromium
pytest_plugins = ["postgres", "browser_support"]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_SPECS = ROOT / "specs"

# The machines are shared and their load varies: a slow draw or a slow example is the machine's,
# not a finding. Properties are judged on what they assert, never on time.
settings.register_profile(
    "shared-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("shared-machine")


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2), "utf-8")
    return path


def spec(spec_id: str, **overrides: Any) -> dict[str, Any]:
    """A minimal valid spec with ``overrides`` applied (None removes a key)."""
    name = spec_id.split(".")[-2].replace("-", "_")
    data: dict[str, Any] = {
        "id": spec_id,
        "name": name,
        "description": "A test tool.",
        "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
    for key, value in overrides.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def add_spec(root: Path, data: dict[str, Any]) -> Path:
    rel = data["id"].replace(".", "/", 1) + ".json"
    return write_json(root / rel, data)


def tree_bytes(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``blade-codegen ARGS`` run in this process: its exit code, stdout and stderr, as a
    subprocess would give them, without a subprocess's second of start-up."""
    from click.testing import CliRunner

    from blade_codegen.cli import main

    before = Path.cwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        result = CliRunner().invoke(main, list(args))
    finally:
        os.chdir(before)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a bug, not an exit code: show its traceback
    return subprocess.CompletedProcess(
        ["blade-codegen", *args], result.exit_code, result.stdout, result.stderr
    )


_MYPY_BASE: list[Path] = []
# What every checked module imports, and nothing a test writes: the only modules a cache may hold
# across runs (a test's modules share names, sizes and mtimes, which mypy's cache cannot tell
# apart, so each run starts from a copy of this and its own modules are checked afresh).
_MYPY_WARM = "import blade_runtime, blade_runtime.client, pydantic\n"


def _mypy_cache() -> Path:
    """A fresh mypy cache holding only the dependencies (pydantic, blade_runtime), copied from
    one made once per test process (per xdist worker) and removed at its end: a check takes a
    tenth of the time of one without a cache, and no result depends on another test's run."""
    import tempfile

    if not _MYPY_BASE:
        import atexit

        folder = Path(tempfile.mkdtemp(prefix="blade-mypy-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        (folder / "warm.py").write_text(_MYPY_WARM, "utf-8")
        warm = ("--cache-dir", str(folder / "base"), str(folder / "warm.py"))
        subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", *warm],
            cwd=folder,
            capture_output=True,
            check=False,
        )
        _MYPY_BASE.append(folder)
    copy = Path(tempfile.mkdtemp(prefix="run-", dir=_MYPY_BASE[0]))
    shutil.copytree(_MYPY_BASE[0] / "base", copy / "cache")
    return copy / "cache"


def run_mypy(*paths: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    cache = _mypy_cache()
    try:
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(cache), *map(str, paths)],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        shutil.rmtree(cache.parent, ignore_errors=True)


def run_ruff(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", *map(str, paths)],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture
def example_specs(tmp_path: Path) -> Path:
    """A private copy of the bundled example specs."""
    target = tmp_path / "specs"
    shutil.copytree(EXAMPLE_SPECS, target)
    return target


@pytest.fixture(scope="session")
def built_examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example package built once for the session: returns the output folder (OUT)."""
    from blade_codegen.build import build

    out = tmp_path_factory.mktemp("out")
    build(EXAMPLE_SPECS, out, "blade_specs")
    return out


BuildFn = Callable[..., Any]


def _corpus() -> Path:
    """The shared corpus (``$BLADE_CORPUS``, else ``../shared/corpus`` beside the checkout) when
    it is there, else the copy in tests/corpus, so that every checkout runs the corpus tests."""
    for candidate in (os.environ.get("BLADE_CORPUS"), str(ROOT.parent / "shared" / "corpus")):
        if candidate and (Path(candidate) / "schemastore").is_dir():
            return Path(candidate)
    return Path(__file__).resolve().parent / "corpus"


CORPUS = _corpus()


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def write_mcp_corpus(root: Path, source: Path = CORPUS / "mcp-tools.jsonl") -> int:
    """Spec files for every tool in ``tests/corpus/mcp-tools.jsonl``, through the importer (as
    ``blade-codegen import --from mcp`` per server); returns how many.

    Each server gets the namespace ``mcp.<server>`` and the name prefix ``<server>.``: names
    repeat across servers, and one package needs them unique.
    """
    from blade_codegen.importer import Tool, import_tools, read_tools, write_imported

    by_server: dict[str, list[Tool]] = {}
    lines = source.read_text("utf-8").splitlines()
    tools, unreadable = read_tools(source, "mcp")
    assert unreadable == []
    for line, tool in zip(lines, tools, strict=True):
        by_server.setdefault(_slug(json.loads(line)["server"]), []).append(tool)
    count = 0
    for server, server_tools in sorted(by_server.items()):
        files = import_tools(server_tools, "mcp", f"mcp.{server}", "mcp-tools.jsonl", f"{server}.")
        write_imported(root, files, force=False)
        count += len(files)
    return count


def write_schemastore_corpus(root: Path, source: Path = CORPUS / "schemastore") -> int:
    """Spec files for every SchemaStore schema of ``source/schemas`` as a tool's input schema,
    through the importer (as an Anthropic tools array); returns how many.

    Each tool is ``schemastore.ss-<file stem>.v1`` and its description is the file's stem, which
    ``instances.jsonl`` names."""
    from blade_codegen.importer import import_tools, read_tools, write_imported

    records = [
        {
            "name": "ss_" + path.stem.replace(".", "_"),
            "description": path.stem,
            "input_schema": json.loads(path.read_text("utf-8")),
        }
        for path in sorted((source / "schemas").glob("*.json"))
    ]
    root.mkdir(parents=True, exist_ok=True)
    listing = root.parent / "schemastore-tools.json"
    listing.write_text(json.dumps(records), "utf-8")
    tools, unreadable = read_tools(listing, "anthropic")
    assert unreadable == []
    write_imported(root, import_tools(tools, "anthropic", "schemastore", listing.name), False)
    return len(records)


def import_generated(out: Path, module: str) -> Any:
    """``module`` imported from the build output ``out``, which is on the import path only
    meanwhile."""
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(str(out))


def _import_package(out: Path, package: str) -> Any:
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return importlib.import_module(package)


def build_and_import(root: Path, package: str, *specs: dict[str, Any]) -> Any:
    """``specs`` written under ``root/specs``, built as ``package`` into ``root/out`` and
    imported (``root/out`` stays on the import path, so its modules import as any package's)."""
    from blade_codegen.build import build

    for data in specs:
        add_spec(root / "specs", data)
    build(root / "specs", root / "out", package)
    return _import_package(root / "out", package)


@pytest.fixture(scope="session")
def example_package(built_examples: Path) -> Any:
    """The built example package, imported (``blade_specs``)."""
    return _import_package(built_examples, "blade_specs")


@pytest.fixture(scope="session")
def mcp_package(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Every MCP corpus tool built into the package ``blade_mcp`` and imported."""
    from blade_codegen.build import build

    root = tmp_path_factory.mktemp("mcp")
    assert write_mcp_corpus(root / "specs") == 312
    build(root / "specs", root / "out", "blade_mcp")
    return _import_package(root / "out", "blade_mcp")


# The import path as the session found it: site-packages, PYTHONPATH, .pth entries.
_ENVIRONMENT = frozenset(Path(p or ".").resolve() for p in sys.path)


@pytest.fixture(autouse=True, scope="session")
def _hermetic_spec_packages() -> Iterator[None]:
    """Spec packages installed in the environment that runs the tests (say, by trying the
    README's ``pack`` example, or on PYTHONPATH) are invisible to the generator in this process:
    only the ones a test installs itself (a folder it puts on sys.path) count, so no result
    depends on them."""
    from blade_codegen import dependencies

    real_locate, real_installed = dependencies.locate, dependencies.installed_spec_packages

    def in_environment(folder: Path) -> bool:
        return folder.resolve().parent in _ENVIRONMENT

    def locate(name: str) -> dependencies.Dependency | dependencies.Unavailable:
        found = real_locate(name)
        if isinstance(found, dependencies.Dependency) and in_environment(found.folder):
            return dependencies.Unavailable(name, f"the spec package {name} is not installed", "")
        return found

    def installed_spec_packages() -> list[dependencies.Dependency]:
        return [d for d in real_installed() if not in_environment(d.folder)]

    patch = pytest.MonkeyPatch()
    patch.setattr(dependencies, "locate", locate)
    patch.setattr(dependencies, "installed_spec_packages", installed_spec_packages)
    yield
    patch.undo()


@pytest.fixture
def deploy(example_package: Any) -> Any:
    """The example package's deploy_service.v1 module."""
    from blade_specs.deploy import deploy_service_v1

    return deploy_service_v1


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Each store engine in turn: memory, SQLite in ``tmp_path``, PostgreSQL (a fresh
    database). A module with a ``store`` of its own uses that one."""
    from blade_runtime.stores.memory import MemoryStore
    from blade_runtime.stores.sqlite import SQLiteStore
    from blade_runtime.stores.urls import open_store

    if request.param == "postgres":
        made = open_store(request.getfixturevalue("postgres_url"))
    else:
        made = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "store.db")
    yield made
    made.close()


class _Turns:
    """Turns at the machine among the workers of one run: a test marked ``alone`` (a bound on
    latency is part of what it asserts) runs while no other test does; the others go on
    together. Two flocks: ``gate`` is taken by whoever starts, briefly, so that a test waiting
    to run alone holds back the tests that start after it (a shared lock alone would let them
    starve it)."""

    def __init__(self, folder: Path, run: str) -> None:
        self._gate = os.open(folder / f"blade-tests-{run}.gate", os.O_CREAT | os.O_RDWR)
        self._share = os.open(folder / f"blade-tests-{run}.share", os.O_CREAT | os.O_RDWR)

    @contextlib.contextmanager
    def turn(self, alone: bool) -> Iterator[None]:
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._share, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._share, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def _turns(testrun_uid: str) -> _Turns:
    return _Turns(Path(tempfile.gettempdir()), testrun_uid)


@pytest.fixture(autouse=True)
def _machine_turn(request: pytest.FixtureRequest, _turns: _Turns) -> Iterator[None]:
    with _turns.turn(request.node.get_closest_marker("alone") is not None):
        yield


# Session fixtures cheap enough for every xdist worker to make its own.
_PER_WORKER = frozenset({"built_examples", "example_package", "postgres_dsn"})
# Groups that take minutes: scheduled first, so that the other worker fills in around them.
_HEAVY = ("mcp_package", "test_schemastore")
# The order work starts in, longest first (their share of a run: the SchemaStore build alone is
# about a quarter), so that no long group starts last while the other worker idles. xdist's own
# order (by number of tests, --loadscope-reorder) is off in pyproject.toml.
_LONGEST_FIRST = ("test_schemastore", "mcp_package", "worker_package", "test_pack", "test_inbox")
# Also left out of the quick subset: wheels and fresh virtual environments, worker processes
# killed and restarted, a browser.
_SLOW_MODULES = frozenset({"test_pack", "test_workers", "test_inbox", "test_mcp_conformance"})


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than there are cores. A quarter of a worker's time is spent
    waiting (leases running out, worker processes, the database, the browser) with its core
    idle: on 2 cores, run after run, 3 workers took 160 s where 2 took 187 s, for the same CPU.
    The cores are those this process may run on, as xdist's own ``auto`` counts them."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cores or 1) + 1


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist (``--dist loadgroup``), the tests that share an expensive fixture run on one
    worker, so it is made once: a session fixture other than the cheap ones groups its users, a
    module-scoped one its module's users. The corpus groups and _SLOW_MODULES are marked
    ``slow`` (``-m "not slow"`` is the quick subset), and the longest groups run first."""
    grouping = bool(getattr(config.option, "loadgroup", False))  # set in xdist's workers
    groups = {id(item): _group(item) for item in items}  # ids: _suffix_group renames items
    for item in items:
        group = groups[id(item)]
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            if grouping and hasattr(item, "_id"):
                _suffix_group(item, group)
        corpus = group is not None and any(heavy in group for heavy in _HEAVY)
        if corpus or Path(item.nodeid.split("::")[0]).stem in _SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: _start_order(item, groups[id(item)]))  # stable


def _start_order(item: pytest.Item, group: str | None) -> tuple[int, bool]:
    """The groups of _LONGEST_FIRST in that order, then other slow tests, then the rest (within
    a rank, the order of collection)."""
    rank = _LONGEST_FIRST.index(group) if group in _LONGEST_FIRST else len(_LONGEST_FIRST)
    return rank, item.get_closest_marker("slow") is None


def _suffix_group(item: pytest.Item, group: str) -> None:
    """What xdist 3.8's loadgroup does to a grouped item's id (``nodeid@group``, which its
    scheduler splits on), done where pytest 9 keeps the id: xdist still sets ``_nodeid``, which
    pytest 9 no longer reads, so without this no group held and the corpus packages were built
    once per worker."""
    from _pytest.nodeid import NodeId

    item._id = NodeId.parse(f"{item.nodeid}@{group}")


def _group(item: pytest.Item) -> str | None:
    definitions = getattr(item, "_fixtureinfo", None)
    if definitions is None:
        return None
    module_group = None
    for name in sorted(item.fixturenames):
        found = definitions.name2fixturedefs.get(name)
        if not found:
            continue
        if not _ours(found[-1].func):
            continue  # pytest's own (tmp_path_factory...) are per worker anyway
        scope = found[-1].scope
        if scope == "session" and name not in _PER_WORKER and not name.startswith("_"):
            return name  # a session fixture groups across modules: it wins
        if scope in ("module", "class", "package"):
            module_group = Path(item.nodeid.split("::")[0]).stem
    return module_group


_OURS: dict[Callable[..., Any], bool] = {}  # asked for every fixture of every item: once each


def _ours(function: Callable[..., Any]) -> bool:
    if function not in _OURS:
        import inspect

        source = inspect.getsourcefile(function)
        _OURS[function] = source is not None and Path(source).resolve().is_relative_to(
            ROOT / "tests"
        )
    return _OURS[function]


def pytest_report_header() -> str:
    return f"blade corpus: {CORPUS}"
