"""Every ```python block of the README and of docs/*.md runs, and type-checks, against the example
package built in a fresh project as the README says: the documentation cannot drift from the
code. Shell blocks marked ``<!-- readme: run -->`` on the line before their fence run too (the
quick start, from an empty folder), and every relative link resolves.

A Python block that cannot run here says so on the line before its fence:
``<!-- readme: not run: REASON -->`` (e.g. it needs a server). Such a block is still compiled and
type-checked, and the list of them stays tiny (a test holds it to MAX_NOT_RUN).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from conftest import EXAMPLE_SPECS, ROOT, run_cli, run_mypy

from blade_codegen.render import environment

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
NOT_RUN = re.compile(r"^<!-- readme: not run: (?P<reason>.*\S) -->$")
RUN_SHELL = "<!-- readme: run -->"
MAX_NOT_RUN = 2


@dataclass(frozen=True)
class Snippet:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    marker: str  # the line before the fence, stripped

    @property
    def label(self) -> str:
        return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"

    @property
    def not_run(self) -> str | None:
        found = NOT_RUN.match(self.marker)
        return found.group("reason") if found else None

    @property
    def stem(self) -> str:
        return re.sub(r"[^A-Za-z0-9]", "_", self.label)


def blocks(page: Path) -> list[Snippet]:
    found = []
    lines = page.read_text("utf-8").splitlines()
    index = 0
    while index < len(lines):
        fence = lines[index].strip()
        if fence.startswith("```") and len(fence) > 3:
            start = index
            index += 1
            body = []
            while lines[index].strip() != "```":
                body.append(lines[index])
                index += 1
            marker = lines[start - 1].strip() if start else ""
            found.append(Snippet(page, start + 1, fence[3:], "\n".join(body) + "\n", marker))
        elif fence == "```":  # a block without a language: skip to its end
            index += 1
            while lines[index].strip() != "```":
                index += 1
        index += 1
    return found


ALL = [snippet for page in PAGES for snippet in blocks(page)]
PYTHON = [s for s in ALL if s.language == "python"]
RUNNABLE = [s for s in PYTHON if s.not_run is None]
# What `init` writes as quickstart.py: the README shows it, and it runs beside what init builds.
QUICKSTART = (
    environment()
    .get_template("init_quickstart.py.jinja")
    .render(package="blade_specs", out="generated")
)
SHELL = [s for s in ALL if s.language in ("sh", "bash") and s.marker == RUN_SHELL]


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh project set up as the docs say: the example specs, [tool.blade-codegen] in
    pyproject.toml, and `blade-codegen build` writing generated/blade_specs."""
    root = tmp_path_factory.mktemp("docs")
    shutil.copytree(EXAMPLE_SPECS, root / "specs")
    (root / "pyproject.toml").write_text(
        '[tool.blade-codegen]\nspecs = "specs"\nout = "generated"\npackage = "blade_specs"\n',
        "utf-8",
    )
    built = run_cli("build", cwd=root)
    assert built.returncode == 0, built.stderr
    return root


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's quick start project: `blade-codegen init`, then `blade-codegen build`."""
    root = tmp_path_factory.mktemp("quickstart")
    for step in ("init", "build"):
        done = run_cli(step, cwd=root)
        assert done.returncode == 0, done.stderr
    return root


@pytest.fixture
def projects(request: pytest.FixtureRequest) -> dict[bool, Path]:
    """The project a block runs in: the quick start's for QUICKSTART, else the examples'."""
    return {
        True: request.getfixturevalue("quickstart"),
        False: request.getfixturevalue("examples"),
    }


def test_the_docs_have_the_snippets_this_test_runs() -> None:
    pages = {s.page for s in RUNNABLE}
    assert len(RUNNABLE) >= 15 and len(pages) >= 8, [s.label for s in PYTHON]
    assert any("ToolPending" in s.code and "submit" in s.code for s in RUNNABLE)
    assert [s.page.name for s in SHELL if "quickstart.py" in s.code] == ["README.md"]


def test_the_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text("utf-8").splitlines()) <= 200


def test_the_readme_shows_the_quickstart_init_writes() -> None:
    """The quick start's code in the README is, byte for byte, the file `init` writes."""
    assert QUICKSTART in [s.code for s in PYTHON if s.page.name == "README.md"]


def test_snippets_not_run_are_few_and_say_why() -> None:
    not_run = [s for s in PYTHON if s.not_run is not None]
    assert len(not_run) <= MAX_NOT_RUN, [(s.label, s.not_run) for s in not_run]
    for snippet in not_run:
        compile(snippet.code, snippet.label, "exec")


def _environment(pythonpath: Path | None) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        environment["PYTHONPATH"] = str(pythonpath)
    # the shell blocks' `python` and `blade-codegen` are this environment's
    environment["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    return environment


@pytest.mark.parametrize("snippet", RUNNABLE, ids=lambda s: s.label)
def test_snippet_runs(snippet: Snippet, projects: dict[bool, Path], tmp_path: Path) -> None:
    """Run in a folder of its own (files it makes stay there), with the generated package on
    the import path as the runtime page's "Using the generated package" says:
    PYTHONPATH=generated."""
    script = tmp_path / "snippet.py"
    script.write_text(snippet.code, "utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_environment(projects[snippet.code == QUICKSTART] / "generated"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{snippet.label}:\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("snippet", SHELL, ids=lambda s: s.label)
def test_shell_block_runs(snippet: Snippet, tmp_path: Path) -> None:
    """A marked shell block, run by bash -e in an empty folder: every command must succeed."""
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", snippet.code],
        cwd=tmp_path,
        env=_environment(None),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"{snippet.label}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    if "quickstart.py" in snippet.code:  # the output the README shows below the block
        assert "{'greeting': 'Hello, Grace!', 'approved_by': 'you'}" in done.stdout


OURS = {"blade_runtime", "blade_specs", "pydantic"}


def _others(code: str) -> set[str]:
    """Top-level modules a snippet imports that are neither ours nor the standard library's."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found - OURS - set(sys.stdlib_module_names)


@pytest.mark.parametrize("quick", [False, True], ids=["examples", "quickstart"])
def test_every_snippet_type_checks(quick: bool, projects: dict[bool, Path]) -> None:
    """All blocks, the ones not run too, pass mypy --strict beside the generated package. What
    they use of other libraries (the adapters' LangGraph, MCP, ...) is typed Any (mypy does not
    follow those imports: analysing LangChain alone took most of a minute); their use of
    blade_runtime and the generated package is checked in full."""
    folder = projects[quick] / "generated"
    chosen = [s for s in PYTHON if (s.code == QUICKSTART) == quick]
    files = []
    for snippet in chosen:
        path = folder / f"doc_{snippet.stem}.py"
        path.write_text(snippet.code, "utf-8")
        files.append(path)
    others = sorted(set().union(*(_others(s.code) for s in chosen)))
    sections = "".join(f"[mypy-{name},{name}.*]\nfollow_imports = skip\n" for name in others)
    (folder / "mypy.ini").write_text(f"[mypy]\n{sections}", "utf-8")  # read from the cwd
    checked = run_mypy(*files, cwd=folder)
    assert checked.returncode == 0, checked.stdout


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of each Markdown link outside code blocks and code spans."""
    found = []
    fenced = False
    for number, line in enumerate(page.read_text("utf-8").splitlines(), 1):
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            prose = re.sub(r"`[^`]*`", "", line)
            found.extend((number, target) for target in LINK.findall(prose))
    return found


def test_every_relative_link_resolves() -> None:
    broken = []
    checked = 0
    for page in PAGES:
        for line, target in _links(page):
            parts = urlsplit(target)
            if parts.scheme or target.startswith("#"):
                continue  # another site's, or an anchor of this page
            path = (page.parent / unquote(parts.path)).resolve()
            checked += 1
            if path.exists():
                continue
            broken.append(f"{page.relative_to(ROOT).as_posix()}:{line}: {target}")
    assert checked >= 20 and not broken, broken


def test_the_index_links_every_page() -> None:
    index = (ROOT / "docs" / "README.md").read_text("utf-8")
    linked = {target for _, target in _links(ROOT / "docs" / "README.md")}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages <= linked, pages - linked
    assert "[Temporal](temporal.md)" in index


def test_the_docs_import_only_public_paths() -> None:
    """Users import what the docs show: the package's top level and its documented modules
    (client, serving, adapters, temporal), never the rings inside (core, stores), which are
    the project's layout and may move."""
    inner = re.compile(r"(?:from|import) blade_runtime\.(core|stores)\b")
    found = [
        f"{page.relative_to(ROOT).as_posix()}:{n}: {line.strip()}"
        for page in PAGES
        for n, line in enumerate(page.read_text("utf-8").splitlines(), 1)
        if inner.search(line)
    ]
    imports = sum(page.read_text("utf-8").count("from blade_runtime") for page in PAGES)
    assert imports >= 20 and found == [], found


def test_the_spec_format_table_names_every_key_the_validator_allows() -> None:
    """A key the meta-schema allows and the table leaves out is one a user finds only in an
    error message."""
    meta = json.loads((ROOT / "codegen" / "blade_codegen" / "spec.schema.json").read_text("utf-8"))
    table = (ROOT / "docs" / "spec-format.md").read_text("utf-8")
    listed = set(re.findall(r"^\| `([A-Za-z$]+)` \|", table, re.MULTILINE))
    assert set(meta["properties"]) - {"$schema"} <= listed, set(meta["properties"]) - listed
