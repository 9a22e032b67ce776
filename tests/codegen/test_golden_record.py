"""The generator's output for the bundled specs is the committed golden record, byte for byte:
a change to models, templates, formatting or the manifest is a reviewable diff
(``tests/golden_record.py`` refreshes it)."""

from __future__ import annotations

import difflib
from pathlib import Path

from conftest import tree_bytes
from golden_record import PACKAGE, RECORD, generate


def test_the_bundled_specs_build_to_the_golden_record(tmp_path: Path) -> None:
    built = tree_bytes(generate(tmp_path / "out"))
    recorded = tree_bytes(RECORD / PACKAGE)
    assert recorded, "no golden record: run .venv/bin/python tests/golden_record.py"
    differing = sorted(
        rel for rel in built.keys() | recorded.keys() if built.get(rel) != recorded.get(rel)
    )
    if differing:
        first = differing[0]
        diff = "".join(
            difflib.unified_diff(
                recorded.get(first, b"").decode("utf-8", "replace").splitlines(keepends=True),
                built.get(first, b"").decode("utf-8", "replace").splitlines(keepends=True),
                f"golden-record/{PACKAGE}/{first}",
                f"built/{PACKAGE}/{first}",
            )
        )
        raise AssertionError(
            f"the generator's output differs from the golden record in {len(differing)} "
            f"file(s) ({', '.join(differing)}); if the change is meant, refresh it with "
            f"`.venv/bin/python tests/golden_record.py` and review the diff:\n{diff[:4000]}"
        )
