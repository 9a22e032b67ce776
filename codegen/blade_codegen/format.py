"""Stage 6, format: ruff's safe fixes, then black, over every newly rendered Python file.

datamodel-code-generator writes, for some schemas, annotations a linter flags: repeated union
members, several ``Literal``s in one union, ``Union``/``Optional``/``List`` and quoted names, and
the imports those leave unused. ruff rewrites exactly those (its safe fixes, a fixed rule list) in
one process for the whole build; black then gives every file one layout.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

# black's default, which is also ruff's: a user's default ruff never re-wraps generated imports.
LINE_LENGTH = 88
RUFF_FIXES = ("PYI016", "PYI030", "UP006", "UP007", "UP035", "UP037", "UP045", "F401")


def format_files(files: Mapping[str, str], fresh: set[str]) -> dict[str, str]:
    """Fix and format the Python files in ``fresh``; reused files were when first made."""
    import black
    from black.mode import Mode, TargetVersion

    mode = Mode(target_versions={TargetVersion.PY311}, line_length=LINE_LENGTH)
    out = dict(files)
    paths = sorted(p for p in fresh if p.endswith(".py"))
    fixed = ruff_fixed({p: files[p] for p in paths})
    for path in paths:
        out[path] = black.format_str(fixed[path], mode=mode)
    return out


def ruff_fixed(files: Mapping[str, str]) -> dict[str, str]:
    """``files`` with ruff's safe fixes of RUFF_FIXES applied (one ruff process for all)."""
    if not files:
        return {}
    from ruff.__main__ import find_ruff_bin

    with tempfile.TemporaryDirectory(prefix="blade-ruff-") as scratch:
        root = Path(scratch)
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text, "utf-8")
        subprocess.run(
            [
                find_ruff_bin(),
                *("check", "--isolated", "--no-cache", "--fix", "--exit-zero", "--quiet"),
                *("--target-version", "py311", "--select", ",".join(RUFF_FIXES), "."),
            ],
            cwd=root,
            check=True,
            capture_output=True,
        )
        return {rel: (root / rel).read_text("utf-8") for rel in files}
