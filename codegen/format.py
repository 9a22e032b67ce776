"""Stage 6, format: black over every newly rendered Python file, in-process."""

from __future__ import annotations

from collections.abc import Mapping

# black's default, which is also ruff's: a user's default ruff never re-wraps generated imports.
LINE_LENGTH = 88


def format_files(files: Mapping[str, str], fresh: set[str]) -> dict[str, str]:
    """Black-format the Python files in ``fresh``; reused files were formatted when first made."""
    import black
    from black.mode import Mode, TargetVersion

    mode = Mode(target_versions={TargetVersion.PY311}, line_length=LINE_LENGTH)
    out = dict(files)
    for path in sorted(fresh):
        if path.endswith(".py"):
            out[path] = black.format_str(files[path], mode=mode)
    return out
