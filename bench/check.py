"""Check benchmark: `blade-codegen check` of 1,000 specs against their lock.

Measures, as fresh processes of the real command (imports included), on the synthetic specs of
bench/build.py:
  - nothing changed: fingerprints equal, so no schema is walked;
  - 10 specs changed compatibly (an enum value added to an input).
The baseline, measured in the same run: the same check with the fingerprint shortcut taken away,
i.e. the unchanged check plus a walk of every one of the 1,000 specs (the walk timed in-process).
Targets: nothing changed < 1 s; 10 changed < 2 s.

Usage: python bench/check.py [--specs N] [--changed K]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from build import BIN, timed, write_tree

from blade_codegen.check import compare_spec, read_lock
from blade_codegen.resolve import resolve_specs


def change_specs(specs: Path, count: int) -> None:
    """Add an enum value to the input of ``count`` specs: compatible, but a schema walk."""
    for path in sorted((specs / "bench").glob("*.json"))[:count]:
        data = json.loads(path.read_text())
        data["inputSchema"]["properties"]["mode"]["enum"].append("paranoid")
        path.write_text(json.dumps(data, indent=2))


def full_walk_seconds(specs: Path, lock: Path) -> float:
    """Every spec compared with its locked contract, fingerprints ignored."""
    resolved = resolve_specs(specs).specs
    baseline = read_lock(lock)
    start = time.perf_counter()
    for spec in resolved:
        list(compare_spec(baseline.released[spec.id], spec))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", type=int, default=1000)
    parser.add_argument("--changed", type=int, default=10)
    args = parser.parse_args()
    command = str(BIN / "blade-codegen")
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        specs = root / "specs"
        write_tree(specs, args.specs)
        timed([command, "lock", str(specs)], root)
        unchanged = min(timed([command, "check", str(specs)], root) for _ in range(3))
        change_specs(specs, args.changed)
        changed = min(timed([command, "check", str(specs)], root) for _ in range(3))
        walk = full_walk_seconds(specs, root / "blade.lock.json")
    print(f"check of {args.specs} specs, nothing changed:   {unchanged:6.2f} s (target < 1 s)")
    print(f"check of {args.specs} specs, {args.changed} changed: {changed:6.2f} s (target < 2 s)")
    baseline = unchanged + walk
    print(f"baseline, the same check walking every spec:  {baseline:6.2f} s")
    print(f"nothing changed: {baseline / unchanged:.2f}x faster than the baseline")


if __name__ == "__main__":
    main()
