"""Every ```python block of the README runs, and type-checks, against the example package built
in a fresh project as the README says: the README cannot drift from the code.

A block that cannot run here says so in the README itself, on the line before its fence:
``<!-- readme: not run: REASON -->`` (e.g. it needs a server). Such a block is still compiled and
type-checked, and the list of them stays tiny (a test holds it to MAX_NOT_RUN).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import EXAMPLE_SPECS, ROOT, run_cli, run_mypy

README = ROOT / "README.md"
NOT_RUN = re.compile(r"^<!-- readme: not run: (?P<reason>.*\S) -->$")
MAX_NOT_RUN = 2


@dataclass(frozen=True)
class Snippet:
    line: int  # of the opening fence, 1-based
    code: str
    not_run: str | None  # why it is not run, as the README says

    @property
    def label(self) -> str:
        return f"README.md:{self.line}"


def snippets(text: str) -> list[Snippet]:
    found = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        if lines[index].strip() == "```python":
            start = index
            index += 1
            body = []
            while lines[index].strip() != "```":
                body.append(lines[index])
                index += 1
            marker = NOT_RUN.match(lines[start - 1].strip()) if start else None
            reason = marker.group("reason") if marker else None
            found.append(Snippet(start + 1, "\n".join(body) + "\n", reason))
        index += 1
    return found


SNIPPETS = snippets(README.read_text("utf-8"))


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh project set up as the README says: the example specs, [tool.blade-codegen] in
    pyproject.toml, and `blade-codegen build` writing generated/blade_specs."""
    root = tmp_path_factory.mktemp("readme")
    shutil.copytree(EXAMPLE_SPECS, root / "specs")
    (root / "pyproject.toml").write_text(
        '[tool.blade-codegen]\nspecs = "specs"\nout = "generated"\npackage = "blade_specs"\n',
        "utf-8",
    )
    built = run_cli("build", cwd=root)
    assert built.returncode == 0, built.stderr
    return root


def test_the_readme_has_the_snippets_this_test_runs() -> None:
    runnable = [s for s in SNIPPETS if s.not_run is None]
    assert len(runnable) >= 6, [s.label for s in SNIPPETS]
    assert any("ToolPending" in s.code and "submit" in s.code for s in runnable)


def test_snippets_not_run_are_few_and_say_why() -> None:
    not_run = [s for s in SNIPPETS if s.not_run is not None]
    assert len(not_run) <= MAX_NOT_RUN, [(s.label, s.not_run) for s in not_run]
    for snippet in not_run:
        compile(snippet.code, snippet.label, "exec")


@pytest.mark.parametrize(
    "snippet", [s for s in SNIPPETS if s.not_run is None], ids=lambda s: s.label
)
def test_snippet_runs(snippet: Snippet, project: Path, tmp_path: Path) -> None:
    """Run in a folder of its own (files it makes stay there), with the generated package on
    the import path as the README's "Using the generated package" says: PYTHONPATH=generated."""
    script = tmp_path / "snippet.py"
    script.write_text(snippet.code, "utf-8")
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environment["PYTHONPATH"] = str(project / "generated")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{snippet.label}:\n{done.stderr[-3000:]}"


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


def test_every_snippet_type_checks(project: Path) -> None:
    """All blocks, the ones not run too, pass mypy --strict beside the generated package. What
    they use of other libraries (the adapters' LangGraph, MCP, ...) is typed Any (mypy does not
    follow those imports: analysing LangChain alone took most of a minute); their use of
    blade_runtime and the generated package is checked in full."""
    folder = project / "generated"
    files = []
    for snippet in SNIPPETS:
        path = folder / f"readme_{snippet.line}.py"
        path.write_text(snippet.code, "utf-8")
        files.append(path)
    others = sorted(set().union(*(_others(s.code) for s in SNIPPETS)))
    sections = "".join(f"[mypy-{name},{name}.*]\nfollow_imports = skip\n" for name in others)
    (folder / "mypy.ini").write_text(f"[mypy]\n{sections}", "utf-8")  # read from the cwd
    checked = run_mypy(*files, cwd=folder)
    assert checked.returncode == 0, checked.stdout
