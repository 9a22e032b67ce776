"""Fidelity report: how faithful the generated models are to their JSON Schemas, on real corpora.

Per corpus (tests/corpus/, the copy of the shared corpus this repository ships with its
licences, or the folder $BLADE_CORPUS names):
  - MCP tools (mcp-tools.jsonl): imported per server with the importer, built, type-checked with
    mypy --strict; for every input and output schema, up to 50 instances drawn from the schema
    (tests/strategies.py) that the validator accepts: each must be accepted by its model
    (a false rejection otherwise) and dump back unchanged (a round-trip failure otherwise);
  - SchemaStore (schemastore/): the 150 schemas imported as tool input schemas, built and
    type-checked; every instance of instances.jsonl checked by the runtime's validation against
    its expected verdict, and every valid one by the model (accepted, round-trips).
Fallbacks are the places where models accept more than their schema (the build's notes).
Target: 100% built and type-checked, zero false rejections, zero round-trip failures.

Usage: python bench/fidelity.py [--instances 50]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from blade_codegen.build import build
from blade_runtime.core.validation import SchemaValidator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from conftest import write_mcp_corpus, write_schemastore_corpus  # noqa: E402
from strategies import round_trip, valid_instances  # noqa: E402


def corpus() -> Path:
    """$BLADE_CORPUS, else tests/corpus/: the same files as the shared corpus (mcp-tools.jsonl,
    schemastore/), so that the bench runs in a fresh clone."""
    chosen = os.environ.get("BLADE_CORPUS")
    root = Path(chosen) if chosen else ROOT / "tests" / "corpus"
    needed = [root / "mcp-tools.jsonl", root / "schemastore" / "instances.jsonl"]
    missing = [str(path) for path in needed if not path.is_file()]
    if missing:
        sys.exit(f"no corpus at {root}: missing {', '.join(missing)} (set BLADE_CORPUS)")
    return root


def typecheck(out: Path, package: str) -> tuple[int, int]:
    """(modules, modules with mypy --strict errors)."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", package],
        cwd=out,
        capture_output=True,
        text=True,
        check=False,
    )
    bad = {line.split(":", 1)[0] for line in done.stdout.splitlines() if ": error:" in line}
    modules = len(list((out / package).rglob("*_v1.py")))
    return modules, len(bad)


def load(out: Path, package: str) -> Any:
    sys.path.insert(0, str(out))
    return __import__(package)


@dataclass
class Tally:
    """How models treated schema-valid instances."""

    instances: int = 0
    rejected: int = 0
    changed: int = 0

    def add(self, adapter: TypeAdapter[Any], value: Any) -> None:
        outcome = round_trip(adapter, value)
        self.instances += 1
        self.rejected += bool(outcome and outcome.startswith("rejected"))
        self.changed += bool(outcome and outcome.startswith("changed"))

    def report(self) -> dict[str, Any]:
        return {
            "instances": self.instances,
            "false rejections": self.rejected,
            "round-trip failures": self.changed,
        }


def built(specs: Path, work: Path, package: str) -> tuple[Any, dict[str, Any]]:
    """Build, type-check and import ``package``: the package, and what the report says of it."""
    result = build(specs, work / "out", package)
    modules, failing = typecheck(work / "out", package)
    facts = {
        "built": modules,
        "type-check failures": failing,
        "fallback places": sum(len(n) for n in result.looser.values()),
    }
    return load(work / "out", package), facts


def mcp(root: Path, work: Path, count: int) -> dict[str, Any]:
    schemas = write_mcp_corpus(work / "specs", root / "mcp-tools.jsonl")
    package, facts = built(work / "specs", work, "fid_mcp")
    tally = Tally()
    for spec in package.load_all():
        for schema, kind in (
            (spec.input_schema, spec.input_type),
            (spec.output_schema, spec.output_type),
        ):
            if schema is not None:
                adapter = TypeAdapter(kind)
                for value in valid_instances(schema, count):
                    tally.add(adapter, value)
    return {"schemas": schemas, **facts, **tally.report()}


def schemastore(root: Path, work: Path) -> dict[str, Any]:
    folder = root / "schemastore"
    schemas = write_schemastore_corpus(work / "specs", folder)
    package, facts = built(work / "specs", work, "fid_ss")
    # Compiled once per schema, not once per instance.
    checks = {
        spec.description: (SchemaValidator(spec.input_schema), TypeAdapter(spec.input_type))
        for spec in package.load_all()
    }
    agree = disagree = 0
    tally = Tally()
    for line in (folder / "instances.jsonl").read_text("utf-8").splitlines():
        record = json.loads(line)
        validator, adapter = checks[record["schema"].removesuffix(".json")]
        valid = validator.is_valid(record["instance"])
        if valid == (record["expected"] == "valid"):
            agree += 1
        else:
            disagree += 1
        if valid:
            tally.add(adapter, record["instance"])
    return {
        "schemas": schemas,
        **facts,
        "verdicts agreeing": agree,
        "verdicts differing": disagree,
        **tally.report(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=50)
    args = parser.parse_args()
    root = corpus()
    with tempfile.TemporaryDirectory() as folder:
        reports = {
            "MCP tools": mcp(root / "", Path(folder) / "mcp", args.instances),
            "SchemaStore": schemastore(root, Path(folder) / "ss"),
        }
    for name, report in reports.items():
        print(name)
        for key, value in report.items():
            print(f"  {key:22} {value}")


if __name__ == "__main__":
    main()
