"""Stage 6, format: ruff's safe fixes, then black, over every newly rendered Python file.

datamodel-code-generator writes, for some schemas, annotations a linter flags: repeated union
members, several ``Literal``s in one union, ``Union``/``Optional``/``List`` and quoted names, and
the imports those leave unused. ruff rewrites exactly those (its safe fixes, a fixed rule list) in
one process for the whole build, and lays the files out as black would; black then gives every
file its layout (one pass instead of two, since the text is close to it already).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import textwrap
import threading
import tokenize
from collections.abc import Mapping
from pathlib import Path

from blade_codegen.syntax import Edit, code_lines, offset, spliced, tokens_of

# black's default, which is also ruff's: a user's default ruff never re-wraps generated imports.
LINE_LENGTH = 88
RUFF_FIXES = ("PYI016", "PYI030", "UP006", "UP007", "UP035", "UP037", "UP045", "F401")


def format_files(files: Mapping[str, str], fresh: set[str]) -> dict[str, str]:
    """Fix and format the Python files in ``fresh``; reused files were when first made."""
    out = dict(files)
    paths = sorted(p for p in fresh if p.endswith(".py"))
    if not paths:
        return out
    with _RuffFixes({p: files[p] for p in paths}) as fixes:
        # black loads while ruff runs: a rebuild of one module waits for neither twice.
        import black  # noqa: F401

        fixed = fixes.result()
    out.update(laid_out(fixed, _cores()))
    return out


# Below this many lines, black runs in this process (bench/build.py): a rebuild of
# a few modules gains nothing from starting a pool and sending it the texts.
PARALLEL_LINES = 20_000


def laid_out(texts: Mapping[str, str], processes: int) -> dict[str, str]:
    """``texts`` through black and ``wrap_long_lines``, the same in any number of processes.
    black is about 40% of a cold build of many specs: a large build spreads it over up to
    ``processes`` forked worker processes, the largest files first. Only a process with no
    other thread forks (a fork copies no other thread, and any lock one held stays held), and
    never by spawning: that imports the caller's main module again, and runs a script that
    builds without an ``if __name__ == "__main__"`` guard once more in every worker. A pool
    that cannot start or breaks (a worker killed) leaves the work to this process."""
    paths = sorted(texts, key=lambda p: (-len(texts[p]), p))
    workers = min(processes, len(paths))
    lines = sum(t.count("\n") for t in texts.values())
    if workers > 1 and lines >= PARALLEL_LINES and _may_fork():
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        try:
            context = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(workers, mp_context=context) as pool:
                laid = pool.map(black_layout, [texts[p] for p in paths])
                return dict(zip(paths, laid, strict=True))
        except (OSError, ValueError, BrokenProcessPool):
            pass
    return {path: black_layout(texts[path]) for path in paths}


def _may_fork() -> bool:
    """Whether this process can fork its formatting workers safely: it has fork (not on
    macOS, whose system libraries do not survive one) and runs no other Python thread."""
    return hasattr(os, "fork") and sys.platform != "darwin" and threading.active_count() == 1


def black_layout(code: str) -> str:
    """black's layout of ``code``, its long lines then wrapped (``wrap_long_lines``)."""
    import black
    from black.mode import Mode, TargetVersion

    mode = Mode(target_versions={TargetVersion.PY311}, line_length=LINE_LENGTH)
    return wrap_long_lines(black.format_str(code, mode=mode))


def _cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# One escape sequence, or one character: a literal is only ever split between these.
_UNIT = re.compile(
    r"\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|N\{[^}]*\}|[0-7]{1,3}|.)|.", re.S
)


def wrap_long_lines(code: str, limit: int = LINE_LENGTH) -> str:
    """Lines black leaves longer than ``limit`` (long string literals, docstrings and comments
    from spec text) wrapped, so a user's linter with line-length rules passes: a literal becomes
    implicitly concatenated pieces (the same value), a docstring and a comment wrap at spaces."""
    lines = code_lines(code)
    if all(len(line.rstrip("\n")) <= limit for line in lines):
        return code
    tokens = tokens_of(code)
    edits: list[Edit] = []
    for i, token in enumerate(tokens):
        (row, col), (end_row, end_col) = token.start, token.end
        if token.type not in (tokenize.COMMENT, tokenize.STRING) or not any(
            len(lines[r - 1].rstrip("\n")) > limit for r in range(row, end_row + 1)
        ):
            continue
        indent = len(lines[row - 1]) - len(lines[row - 1].lstrip())
        if token.type == tokenize.COMMENT:
            text = _wrapped_comment(token.string, col, limit)
        elif token.type == tokenize.STRING and token.string.endswith(('"""', "'''")):
            text = _wrapped_docstring(" " * col + token.string, limit)[col:]
        elif token.type == tokenize.STRING and row == end_row:
            alone = lines[row - 1].strip().rstrip(",") == token.string
            if alone and "://" in token.string and not any(c.isspace() for c in token.string):
                continue  # a URL alone on its line: line-length rules let it be, and it reads
            # The sole argument of a call needs no parentheses of its own (linters flag them);
            # anywhere else (a list, a keyword) the pieces are wrapped in parentheses.
            sole = _neighbour(tokens, i, -1) == "(" and _neighbour(tokens, i, 1) == ")"
            at = col if alone else indent
            width = at if sole and alone else at + 4
            pieces = _pieces(token.string, limit - width)
            if len(pieces) < 2 and (alone or width + len(token.string) > limit):
                continue  # nothing to gain: a literal alone, or one no line of its own holds
            inner = "\n".join(" " * width + p for p in pieces)
            if sole and alone:
                text = inner[width:]
            elif sole:
                text = f"\n{inner}\n{' ' * at}"
            else:
                text = f"(\n{inner}\n{' ' * at})"
        else:
            continue
        edits.append((offset(code, row, col), offset(code, end_row, end_col), text))
    return spliced(code, edits)


def _neighbour(tokens: list[tokenize.TokenInfo], i: int, step: int) -> str:
    """The nearest token before or after ``tokens[i]`` that is code (not a line break)."""
    i += step
    while tokens[i].type in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
        i += step
    return tokens[i].string


def _pieces(literal: str, width: int) -> list[str]:
    """A one-line string literal as literals of at most ``width`` characters (about), split
    between escape sequences, after a space where one is near."""
    prefix = literal[: len(literal) - len(literal.lstrip("rRbBuU"))]
    quote = literal[len(prefix)]
    body = literal[len(prefix) + 1 : -1]
    room = max(width - len(prefix) - 2, 16)
    pieces, current = [], ""
    for unit in _UNIT.findall(body):
        if len(current) + len(unit) > room:
            cut = current.rfind(" ", room // 2) + 1 or len(current)
            pieces.append(current[:cut])
            current = current[cut:]
        current += unit
    pieces.append(current)
    return [f"{prefix}{quote}{piece}{quote}" for piece in pieces if piece]


def _wrapped_docstring(literal: str, limit: int) -> str:
    out = []
    for line in literal.split("\n"):
        if len(line) <= limit:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        wrapped = textwrap.wrap(
            line.strip(), limit - len(indent), break_long_words=False, break_on_hyphens=False
        )
        out.extend(indent + part for part in wrapped)
    return "\n".join(out)


def _wrapped_comment(comment: str, col: int, limit: int) -> str:
    body = comment.lstrip("#")
    lead = "#" + body[: len(body) - len(body.lstrip())]
    wrapped = textwrap.wrap(
        body.strip(), limit - col - len(lead) - 2, break_long_words=False, break_on_hyphens=False
    )
    return ("\n" + " " * col).join(
        lead + ("" if i == 0 else "  ") + part for i, part in enumerate(wrapped)
    )


class _RuffFixes:
    """ruff fixing ``files`` in a scratch folder, started on entering; ``result`` waits for it,
    then has ruff lay them out. Leaving removes the folder (and ends a process still running)."""

    def __init__(self, files: Mapping[str, str]) -> None:
        self.files = files

    def __enter__(self) -> _RuffFixes:
        self.scratch = tempfile.TemporaryDirectory(prefix="blade-ruff-")
        self.root = Path(self.scratch.name)
        try:
            for rel, text in self.files.items():
                (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
                (self.root / rel).write_text(text, "utf-8")
            self.process = self._ruff(
                "check", "--fix", "--exit-zero", "--select", ",".join(RUFF_FIXES)
            )
        except BaseException:
            self.scratch.cleanup()
            raise
        return self

    def _ruff(self, *command: str) -> subprocess.Popen[bytes]:
        from ruff.__main__ import find_ruff_bin

        options = ("--isolated", "--no-cache", "--quiet", "--target-version", "py311")
        return subprocess.Popen(
            [find_ruff_bin(), *command, *options, "."],
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def result(self) -> dict[str, str]:
        self._wait()
        # ruff's black-compatible layout next: black then finds its own layout and stops after
        # one pass (it formats twice whatever it changes), which halves the formatting time.
        self.process = self._ruff("format", "--line-length", str(LINE_LENGTH))
        self._wait()
        return {rel: (self.root / rel).read_text("utf-8") for rel in self.files}

    def _wait(self) -> None:
        stdout, stderr = self.process.communicate()
        if self.process.returncode:
            raise subprocess.CalledProcessError(
                self.process.returncode, self.process.args, stdout, stderr
            )

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.scratch.cleanup()
