"""The golden record: what ``blade-codegen build`` writes for the bundled ``specs/``, committed
under ``tests/fixtures/golden-record/`` so that any change to the generator shows up as a diff to
review (openapi-python-client's ``end_to_end_tests/golden-record`` is the model).

Refresh it after a change to the generator you mean, then review ``git diff``:

    .venv/bin/python tests/golden_record.py

``tests/codegen/test_golden_record.py`` builds the same specs and fails on any difference.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "tests" / "fixtures" / "golden-record"
PACKAGE = "blade_specs"


def generate(out: Path) -> Path:
    """The bundled specs built as ``PACKAGE`` into ``out``; the package's folder."""
    from blade_codegen.build import build

    build(ROOT / "specs", out, PACKAGE)
    return out / PACKAGE


def refresh() -> None:
    with tempfile.TemporaryDirectory() as folder:
        built = generate(Path(folder))
        target = RECORD / PACKAGE
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(built, target, ignore=shutil.ignore_patterns("__pycache__"))
    print(f"wrote {target.relative_to(ROOT)}: review it with git diff", file=sys.stderr)


if __name__ == "__main__":
    refresh()
