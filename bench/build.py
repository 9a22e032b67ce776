"""Build benchmark: prints timings and ratios against a baseline measured in the same run.

Measures, on N synthetic but realistic specs (nested objects, arrays, enums, oneOf, shared refs,
data channels, suspend points):
  - a cold build of N=200 (the `blade-codegen build` command, a fresh process);
  - a no-op rebuild and a one-spec-changed rebuild of 1,000 specs (fresh processes);
  - the baseline: one `datamodel-codegen` CLI process per schema, on a sample, extrapolated to
    every schema slot of the N=200 set.
Targets: cold build >= 10x faster than the baseline; no-op rebuild of 1,000 < 1 s; one change < 2 s.

Usage: python bench/build.py [--cold N] [--large N] [--sample K]
(--cold 0 skips the cold build of N specs and its baseline: only the --large builds run)
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent


def shared_money() -> dict[str, Any]:
    return {
        "$defs": {
            "Currency": {"type": "string", "enum": ["EUR", "USD", "GBP", "JPY"]},
            "Money": {
                "type": "object",
                "properties": {
                    "amount_minor": {"type": "integer"},
                    "currency": {"$ref": "#/$defs/Currency"},
                },
                "required": ["amount_minor", "currency"],
            },
            "Address": {
                "type": "object",
                "properties": {
                    "street": {"type": "string"},
                    "city": {"type": "string"},
                    "country": {"type": "string", "pattern": "^[A-Z]{2}$"},
                },
                "required": ["city", "country"],
            },
        }
    }


def input_schema(rng: random.Random, i: int) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "account_id": {"type": "string", "pattern": "^acc_[a-z0-9]+$", "description": "Account."},
        "limit": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50},
        "mode": {"type": "string", "enum": ["fast", "safe", "dry_run"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 20},
        "amount": {"$ref": "../common/money.schema.json#/$defs/Money"},
        "filter": {
            "type": "object",
            "properties": {
                "since": {"type": "string", "format": "date-time"},
                "status": {"type": "array", "items": {"enum": ["open", "closed", "pending"]}},
                "owner": {
                    "type": "object",
                    "properties": {"id": {"type": "string"}, "team": {"type": "string"}},
                },
            },
        },
        "target": {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"kind": {"const": "user"}, "user_id": {"type": "string"}},
                    "required": ["kind", "user_id"],
                },
                {
                    "type": "object",
                    "properties": {"kind": {"const": "group"}, "group": {"type": "string"}},
                    "required": ["kind", "group"],
                },
            ]
        },
        "note": {"anyOf": [{"type": "string", "maxLength": 280}, {"type": "null"}]},
    }
    for extra in range(rng.randint(2, 8)):
        properties[f"field_{i}_{extra}"] = rng.choice(
            [
                {"type": "number", "minimum": 0},
                {"type": "boolean"},
                {"type": "array", "items": {"$ref": "../common/money.schema.json#/$defs/Address"}},
                {"type": "string", "minLength": 1, "maxLength": 64},
            ]
        )
    return {
        "type": "object",
        "properties": properties,
        "required": ["account_id", "mode"],
        "additionalProperties": False,
    }


def make_spec(rng: random.Random, i: int, description: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "id": f"bench.tool-{i:04d}.v1",
        "name": f"tool_{i:04d}",
        "description": description or f"Synthetic tool {i}: reads and updates account records.",
        "kind": rng.choice(["read_only", "write", "execute"]),
        "sideEffect": rng.choice(["pure", "idempotent", "non_idempotent"]),
        "inputSchema": input_schema(rng, i),
        "outputSchema": {
            "type": "object",
            "properties": {
                "ok": {"type": "boolean"},
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "string"},
                            "total": {"$ref": "../common/money.schema.json#/$defs/Money"},
                        },
                        "required": ["id"],
                    },
                },
            },
            "required": ["ok"],
        },
    }
    if i % 2 == 0:
        spec["dataSchemas"] = {
            "progress": {
                "type": "object",
                "properties": {
                    "step": {"type": "string"},
                    "status": {"enum": ["running", "done", "failed"]},
                    "percent": {"type": "integer", "minimum": 0, "maximum": 100},
                },
                "required": ["step", "status"],
            }
        }
    if i % 3 == 0:
        spec["suspend"] = {
            "approval": {
                "suspendSchema": {
                    "type": "object",
                    "properties": {"prompt": {"type": "string"}},
                    "required": ["prompt"],
                },
                "resumeSchema": {
                    "type": "object",
                    "properties": {"approved": {"type": "boolean"}, "by": {"type": "string"}},
                    "required": ["approved"],
                },
            }
        }
    return spec


def write_tree(root: Path, n: int) -> int:
    """Write n specs and the shared file; returns the number of schema slots (baseline units)."""
    rng = random.Random(42)
    (root / "common").mkdir(parents=True, exist_ok=True)
    (root / "common" / "money.schema.json").write_text(json.dumps(shared_money(), indent=2))
    (root / "bench").mkdir(exist_ok=True)
    slots = 1
    for i in range(n):
        spec = make_spec(rng, i)
        path = root / "bench" / f"tool-{i:04d}.v1.json"
        path.write_text(json.dumps(spec, indent=2))
        slots += 2 + len(spec.get("dataSchemas", {})) + 2 * len(spec.get("suspend", {}))
    return slots


def timed(cmd: list[str], cwd: Path) -> float:
    return timed_cpu(cmd, cwd)[0]


def timed_cpu(cmd: list[str], cwd: Path) -> tuple[float, float]:
    """Wall seconds, and the CPU seconds (user + system) the command used: on a shared machine
    the second says what the command costs when the first says how busy the machine was."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        sys.exit(f"command failed: {' '.join(cmd)}\n{result.stdout}\n{result.stderr}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return elapsed, cpu


def build_cmd(specs: Path, out: Path) -> list[str]:
    return [str(BIN / "blade-codegen"), "build", str(specs), "--out", str(out)]


def baseline_per_schema(specs: Path, work: Path, sample: int) -> float:
    """Seconds per schema for one datamodel-codegen CLI process per schema (its defaults)."""
    schemas = []
    for i, path in enumerate(sorted((specs / "bench").glob("*.json"))[:sample]):
        spec = json.loads(path.read_text())
        # The shared refs resolve against the spec's folder, as a user's script would lay them out.
        target = specs / "bench" / f"input-{i}.json"
        target.write_text(json.dumps(spec["inputSchema"]))
        schemas.append(target)
    start = time.perf_counter()
    for schema in schemas:
        timed(
            [
                str(BIN / "datamodel-codegen"),
                "--input",
                str(schema),
                "--input-file-type",
                "jsonschema",
                "--output-model-type",
                "pydantic_v2.BaseModel",
                "--output",
                str(work / f"{schema.stem}.py"),
            ],
            work,
        )
    for schema in schemas:
        schema.unlink()
    return (time.perf_counter() - start) / len(schemas)


def cold_vs_baseline(work: Path, n: int, sample: int) -> None:
    """A cold build of n specs against one datamodel-codegen process per schema slot."""
    cold_specs = work / "cold" / "specs"
    slots = write_tree(cold_specs, n)
    cold, cold_cpu = timed_cpu(build_cmd(cold_specs, work / "cold" / "out"), work)
    per_schema = baseline_per_schema(cold_specs, work, sample)
    baseline = per_schema * slots
    print(f"cold build, N={n} specs ({slots} schemas): {cold:.2f} s (cpu {cold_cpu:.2f} s)")
    print(
        f"baseline, one datamodel-codegen process per schema: {per_schema:.2f} s/schema "
        f"x {slots} = {baseline:.0f} s (sampled on {sample})"
    )
    print(f"  cold build is {baseline / cold:.1f}x faster than the baseline (target >= 10x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", type=int, default=200)
    parser.add_argument("--large", type=int, default=1000)
    parser.add_argument("--sample", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.cold > 0:
            cold_vs_baseline(work, args.cold, args.sample)

        large_specs = work / "large" / "specs"
        write_tree(large_specs, args.large)
        out = work / "large" / "out"
        first = timed(build_cmd(large_specs, out), work)
        noop, noop_cpu = min(timed_cpu(build_cmd(large_specs, out), work) for _ in range(3))
        changed = []
        for round_ in range(3):
            # Specs 0, 7 and 14 (of fewer, any three): --large below 15 no longer fails.
            path = large_specs / "bench" / f"tool-{round_ * 7 % args.large:04d}.v1.json"
            spec = json.loads(path.read_text())
            spec["inputSchema"]["properties"]["account_id"]["description"] = f"changed {round_}"
            path.write_text(json.dumps(spec, indent=2))
            changed.append(timed_cpu(build_cmd(large_specs, out), work))
        print(f"cold build, N={args.large}: {first:.2f} s")
        print(f"no-op rebuild, N={args.large}: {noop:.2f} s (cpu {noop_cpu:.2f} s; target < 1 s)")
        wall, cpu = min(changed)
        rounds = ", ".join(f"{w:.2f}" for w, _ in changed)
        print(
            f"one spec changed, N={args.large}: {wall:.2f} s (cpu {cpu:.2f} s; rounds {rounds}; "
            "target < 2 s)"
        )
        shutil.rmtree(work / "large")


if __name__ == "__main__":
    main()
