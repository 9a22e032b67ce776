"""Pack benchmark: `blade-codegen pack` against a cold `blade-codegen build` of the same specs.

Both as fresh processes of the real commands, on the synthetic specs of bench/build.py. Packing is
a cold build plus the lock check, the README, an sdist and a wheel built from it (hatchling through
pypa/build); the ratio shows what packaging adds to generating. No target is set by the issue;
the expectation is that packaging adds little (under 1.5x a cold build).

Usage: python bench/pack.py [--specs N]
"""

from __future__ import annotations

import argparse
import tempfile
import zipfile
from pathlib import Path

from build import BIN, build_cmd, timed, write_tree


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--specs", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        specs = root / "specs"
        write_tree(specs, args.specs)
        built = timed(build_cmd(specs, root / "out"), root)
        pack = [str(BIN / "blade-codegen"), "pack", str(specs), "--name", "blade-tool-bench"]
        packed = timed([*pack, "--version", "1.0.0", "--out", str(root / "dist")], root)
        wheel = next((root / "dist").glob("*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            members = len(archive.namelist())
        size = wheel.stat().st_size / 1e6
    print(f"cold build, N={args.specs} specs: {built:.2f} s")
    print(f"pack, N={args.specs} specs: {packed:.2f} s ({members} files, wheel {size:.1f} MB)")
    print(f"  pack is {packed / built:.2f}x a cold build")


if __name__ == "__main__":
    main()
