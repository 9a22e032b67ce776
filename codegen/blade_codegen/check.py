"""``blade-codegen check`` and ``lock``: compare the spec set with its released contracts.

A baseline maps each id to the wire contract last released under it: from the lock file
(``blade.lock.json``, committed next to the specs), or from the specs at a git revision. An id whose
fingerprint equals the baseline's is skipped without walking a schema. For the others, each part
is compared in the directions that matter for it (see ``compat``), and every breaking change
becomes a finding with the fix: publish the change under a new id.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from blade_codegen.compat import Direction, compare
from blade_codegen.problems import pointer
from blade_codegen.resolve import ResolvedSpec, resolve_specs
from blade_codegen.witness import example

LOCK_NAME = "blade.lock.json"
LOCK_VERSION = 1


class BaselineError(Exception):
    """The baseline (lock file or git revision) cannot be read."""


@dataclass(frozen=True)
class Released:
    """What the baseline says about one id."""

    fingerprints: tuple[str, ...]  # every released fingerprint, oldest first
    wire: Mapping[str, Any]  # the latest released wire contract
    deprecated: bool = False
    data_names: frozenset[str] = frozenset()  # every data channel name ever released
    suspend_names: frozenset[str] = frozenset()

    @property
    def fingerprint(self) -> str:
        return self.fingerprints[-1]


@dataclass(frozen=True)
class Waiver:
    """A reviewed decision to accept one undecidable finding between two fingerprints."""

    id: str
    old: str
    new: str
    rule: str
    path: str
    reason: str

    def covers(self, finding: Finding) -> bool:
        return (self.id, self.old, self.new, self.rule, self.path) == (
            finding.id,
            finding.old_fingerprint,
            finding.new_fingerprint,
            finding.rule,
            finding.path,
        )


@dataclass(frozen=True)
class Baseline:
    released: Mapping[str, Released]
    waivers: tuple[Waiver, ...] = ()
    source: str = LOCK_NAME


@dataclass(frozen=True)
class Finding:
    """One breaking (or undecidable) change, with everything its message needs."""

    id: str
    source: str
    part: str
    path: str
    rule: str
    old: Any
    new: Any
    detail: str
    directions: tuple[Direction, ...]
    undecidable: bool = False
    example: Any = None
    has_example: bool = False
    old_fingerprint: str = ""
    new_fingerprint: str = ""
    waived: bool = False

    def message(self) -> str:
        where = f"{self.part} {self.path}" if self.path else self.part
        who = " and ".join(
            "callers (it accepts less)" if d == "accepting" else "clients (it emits more)"
            for d in self.directions
        )
        verdict = "undecidable, treated as breaking" if self.undecidable else f"breaks {who}"
        change = f"{_show(self.old)} -> {_show(self.new)} ({self.detail})"
        text = f"{self.source}: {self.id}: {where}: {self.rule}: {change}; {verdict}"
        if self.has_example:
            text += f"; e.g. {_show(self.example)}"
        if self.waived:
            return text + "; waived in the lock"
        return text + f"; fix: publish it as {next_id(self.id)} and keep {self.id}"

    def as_json(self) -> dict[str, Any]:
        data = {
            "id": self.id,
            "source": self.source,
            "part": self.part,
            "path": self.path,
            "rule": self.rule,
            "old": self.old,
            "new": self.new,
            "detail": self.detail,
            "breaks": list(self.directions),
            "undecidable": self.undecidable,
            "waived": self.waived,
            "fix": f"publish it as {next_id(self.id)} and keep {self.id}",
            "old_fingerprint": self.old_fingerprint,
            "new_fingerprint": self.new_fingerprint,
        }
        if self.has_example:
            data["example"] = self.example
        return data


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    compared: int = 0
    unchanged: int = 0

    @property
    def breaking(self) -> list[Finding]:
        return [f for f in self.findings if not f.waived]


def next_id(spec_id: str) -> str:
    match = re.fullmatch(r"(.*\.v)(\d+)", spec_id)
    return f"{match.group(1)}{int(match.group(2)) + 1}" if match else f"{spec_id}.v2"


# -- the baseline ----------------------------------------------------------------------------------


_META_SCHEMA = "https://json-schema.org/draft/2020-12/schema"  # bundled, never fetched
_STRINGS = {"type": "array", "items": {"type": "string"}}
# What ``read_lock`` relies on, checked in one place: a lock edited by hand or half-merged is
# refused with the place that is wrong, instead of failing somewhere in the comparison.
LOCK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["lockVersion", "specs"],
    "properties": {
        "lockVersion": {"const": LOCK_VERSION},
        "specs": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["fingerprints", "latest"],
                "properties": {
                    "fingerprints": {**_STRINGS, "minItems": 1},
                    "deprecated": {"type": "boolean"},
                    "dataChannels": _STRINGS,
                    "suspendPoints": _STRINGS,
                    "latest": {
                        "type": "object",
                        "required": ["id", "execution", "schemas"],
                        "properties": {
                            "id": {"type": "string"},
                            "execution": {"enum": ["backend", "client"]},
                            "schemas": {
                                "type": "object",
                                "propertyNames": {
                                    "pattern": "^(input|output|(data|suspend|resume|effect):.+)$"
                                },
                                # Bundled schemas: the comparison walks them as 2020-12.
                                "additionalProperties": {"$ref": _META_SCHEMA},
                            },
                            "deadlines": {
                                "type": "object",
                                "additionalProperties": {"type": "integer"},
                            },
                        },
                    },
                },
            },
        },
        "waivers": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "old", "new", "rule", "path", "reason"],
                "properties": {
                    k: {"type": "string"} for k in ("id", "old", "new", "rule", "path", "reason")
                },
                "additionalProperties": False,
            },
        },
    },
}
_LOCK_FIX = "restore it from version control; `blade-codegen lock` writes it, never edit it by hand"


def read_lock(path: Path) -> Baseline:
    """The lock at ``path``; an absent lock is an empty baseline (nothing released yet)."""
    if not path.exists():
        return Baseline({}, (), str(path))
    try:
        text = path.read_text("utf-8")
        data = json.loads(text)
    except (OSError, ValueError) as error:
        raise BaselineError(f"{path}: not a readable lock file ({error})") from None
    _check_lock(path, text, data)
    released = {
        spec_id: Released(
            fingerprints=tuple(entry["fingerprints"]),
            wire=entry["latest"],
            deprecated=entry.get("deprecated", False),
            data_names=frozenset(entry.get("dataChannels", [])),
            suspend_names=frozenset(entry.get("suspendPoints", [])),
        )
        for spec_id, entry in data["specs"].items()
    }
    waivers = tuple(Waiver(**w) for w in data.get("waivers", []))
    return Baseline(released, waivers, str(path))


@cache
def _lock_validator() -> Any:
    """``LOCK_SCHEMA`` compiled once (``build --watch`` reads the lock on every rebuild)."""
    import jsonschema_rs

    return jsonschema_rs.validator_for(LOCK_SCHEMA)


def _check_lock(path: Path, text: str, data: Any) -> None:
    """Raise BaselineError naming the first place (in document order) where ``data`` is not a
    lock: ``path:line:col: pointer: message (fix)``."""
    from blade_codegen.load import SourceFile

    version = data.get("lockVersion", LOCK_VERSION) if isinstance(data, dict) else LOCK_VERSION
    if version != LOCK_VERSION:  # a newer tool's lock: its shape is not ours to judge
        raise BaselineError(f"{path}: lockVersion {version!r} is not {LOCK_VERSION}")
    errors = list(_lock_validator().iter_errors(data))
    if not errors:
        return
    source = SourceFile(path.parent, str(path), text, data, "")
    # The deepest error of the first place: "latest: missing execution", not "entry invalid".
    first = min(errors, key=lambda e: (source.locate(e.instance_path), -len(e.instance_path)))
    message = f"not a lock file: {first.message}"
    raise BaselineError(str(source.problem(first.instance_path, message, _LOCK_FIX)))


def lock_text(baseline: Baseline) -> str:
    """The lock file: sorted keys, one id per block, stable across runs."""
    specs = {
        spec_id: {
            "fingerprints": list(entry.fingerprints),
            "deprecated": entry.deprecated,
            "dataChannels": sorted(entry.data_names),
            "suspendPoints": sorted(entry.suspend_names),
            "latest": entry.wire,
        }
        for spec_id, entry in sorted(baseline.released.items())
    }
    waivers = [w.__dict__ for w in sorted(baseline.waivers, key=lambda w: (w.id, w.path, w.rule))]
    document = {"lockVersion": LOCK_VERSION, "specs": specs, "waivers": waivers}
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def git_ref_allowed(ref: str) -> bool:
    """Whether ``ref`` may be handed to git: one starting with "-" would reach it as an option
    (``--output=FILE`` writes a file)."""
    return bool(ref) and not ref.startswith("-")


def git_baseline(specs: Path, ref: str) -> Baseline:
    """The specs as they were at ``ref``, each as its only released version."""
    if not git_ref_allowed(ref):
        raise BaselineError(f"git:{ref}: not a git revision")
    try:
        top = _git(specs, "rev-parse", "--show-toplevel").strip()
        inside = specs.resolve().relative_to(Path(top).resolve()).as_posix()
    except (subprocess.CalledProcessError, OSError, ValueError) as error:
        raise BaselineError(
            f"git:{ref}: {_git_said(error)} (run it in a git checkout of {specs}, "
            "or compare with the lock: --against lock)"
        ) from None
    try:
        archive = subprocess.run(
            ["git", "-C", top, "archive", "--format=tar", ref, inside],
            capture_output=True,
            check=True,
        ).stdout
    except (subprocess.CalledProcessError, OSError) as error:
        raise BaselineError(
            f"git:{ref}: {_git_said(error)} (name a branch, tag or commit of {top})"
        ) from None
    with tempfile.TemporaryDirectory() as folder:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(folder, filter="data")
        old_specs = Path(folder) / inside
        if not old_specs.is_dir():
            return Baseline({}, (), f"git:{ref}")
        try:
            resolved = resolve_specs(old_specs)
        except Exception as error:
            raise BaselineError(f"git:{ref}: the specs there do not resolve ({error})") from None
    return Baseline({s.id: released_from(s) for s in resolved.specs}, (), f"git:{ref}")


def released_from(spec: ResolvedSpec, before: Released | None = None) -> Released:
    """``spec`` as the newest release of its id, after ``before``."""
    data = frozenset(s.key for s in spec.data)
    points = frozenset(pair[0].key for pair in spec.suspend)
    history = before.fingerprints if before else ()
    if spec.fingerprint not in history[-1:]:
        history = (*history, spec.fingerprint)
    return Released(
        fingerprints=history,
        wire=spec.wire,
        deprecated=spec.deprecated or (before.deprecated if before else False),
        data_names=data | (before.data_names if before else frozenset()),
        suspend_names=points | (before.suspend_names if before else frozenset()),
    )


# -- comparing -------------------------------------------------------------------------------------


def check(specs: list[ResolvedSpec], baseline: Baseline) -> Report:
    """Every breaking or undecidable change from ``baseline`` to ``specs``."""
    report = Report()
    current = {spec.id: spec for spec in specs}
    for spec in specs:
        released = baseline.released.get(spec.id)
        if released is None:
            continue
        if released.fingerprint == spec.fingerprint:
            report.unchanged += 1
            continue
        report.compared += 1
        for finding in compare_spec(released, spec):
            waived = any(w.covers(finding) for w in baseline.waivers)
            report.findings.append(_replace(finding, waived=waived) if waived else finding)
    for spec_id, released in sorted(baseline.released.items()):
        if spec_id not in current and not released.deprecated:
            report.findings.append(
                Finding(
                    id=spec_id,
                    source=baseline.source,
                    part="spec",
                    path="",
                    rule="ID_REMOVED",
                    old=spec_id,
                    new=None,
                    detail="a released id disappeared without being deprecated first",
                    directions=("accepting", "emitting"),
                    old_fingerprint=released.fingerprint,
                )
            )
    return report


def compare_spec(released: Released, spec: ResolvedSpec) -> Iterator[Finding]:
    """The findings for one id whose fingerprint changed."""
    old, new = released.wire, spec.wire

    def finding(
        part: str,
        path: str,
        rule: str,
        before: Any,
        after: Any,
        detail: str,
        directions: tuple[Direction, ...] = ("accepting", "emitting"),
        **more: Any,
    ) -> Finding:
        return Finding(
            id=spec.id,
            source=spec.source.rel,
            part=part,
            path=path,
            rule=rule,
            old=before,
            new=after,
            detail=detail,
            directions=directions,
            old_fingerprint=released.fingerprint,
            new_fingerprint=spec.fingerprint,
            **more,
        )

    def spec_level(rule: str, before: Any, after: Any, detail: str) -> Finding:
        return finding("spec", "", rule, before, after, detail)

    if old["execution"] != new["execution"]:
        yield spec_level("EXECUTION_CHANGED", old["execution"], new["execution"], "who runs it")
        return
    old_schemas: Mapping[str, Any] = old["schemas"]
    new_schemas: Mapping[str, Any] = new["schemas"]
    old_points = {k.split(":", 1)[1] for k in old_schemas if k.startswith("suspend:")}
    new_points = {k.split(":", 1)[1] for k in new_schemas if k.startswith("suspend:")}
    for point in sorted(new_points - old_points):
        yield spec_level("SUSPEND_POINT_ADDED", None, point, "stored calls cannot resume it")
    for point in sorted(old_points - new_points):
        yield spec_level("SUSPEND_POINT_REMOVED", point, None, "pending actions cannot resume")
    old_deadlines: Mapping[str, int] = old.get("deadlines", {})
    new_deadlines: Mapping[str, int] = new.get("deadlines", {})
    for point in sorted(old_points & new_points):
        before, after = old_deadlines.get(point), new_deadlines.get(point)
        if after is not None and (before is None or after < before):
            yield finding(
                f"suspend point {point!r}",
                "",
                "DEADLINE_SHORTENED",
                before,
                after,
                "a pending action that waited as long as before would now expire (TIMEOUT)",
            )
    for channel in sorted(_channels(new_schemas) - _channels(old_schemas)):
        if channel in released.data_names:
            yield spec_level(
                "DATA_CHANNEL_NAME_REUSED",
                None,
                channel,
                "a removed channel's name cannot come back: stored records use it",
            )
    if "output" in old_schemas and "output" not in new_schemas:
        yield spec_level("OUTPUT_SCHEMA_REMOVED", "output", None, "the output is now any JSON")
    client = new["execution"] == "client"
    for key in sorted(set(old_schemas) & set(new_schemas) | ({"output"} & set(new_schemas))):
        directions = _directions(key, client)
        before = old_schemas.get(key, True)
        after = new_schemas[key]
        for change in compare(before, after):
            broken = tuple(d for d in directions if change.breaks(d))
            if not broken:
                continue
            found, value = example(change, before, after, broken[0])
            yield finding(
                _part(key),
                pointer(*change.instance_path) or "/",
                change.rule,
                change.old,
                change.new,
                change.detail,
                broken,
                undecidable=change.effect == "undecidable",
                example=value,
                has_example=found,
            )


def _directions(key: str, client: bool) -> tuple[Direction, ...]:
    if client and key in ("input", "output"):
        return ("accepting", "emitting")
    if key in ("input",) or key.startswith("resume:"):
        return ("accepting",)
    return ("emitting",)


def _part(key: str) -> str:
    kind, _, name = key.partition(":")
    return {
        "input": "input",
        "output": "output",
        "data": f"data channel {name!r}",
        "suspend": f"suspend point {name!r} payload",
        "resume": f"suspend point {name!r} resume",
        "effect": f"effect {name!r}",
    }[kind]


def _channels(schemas: Mapping[str, Any]) -> set[str]:
    return {k.split(":", 1)[1] for k in schemas if k.startswith("data:")}


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _replace(finding: Finding, **changes: Any) -> Finding:
    return Finding(**{**finding.__dict__, **changes})


def _git_said(error: Exception) -> str:
    """The last line git wrote on stderr (bytes or text, by how it was run), else the error."""
    said = getattr(error, "stderr", None) or ""
    if isinstance(said, bytes):
        said = said.decode(errors="replace")
    lines = str(said).strip().splitlines()
    return lines[-1] if lines else str(error)


def _git(where: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(where), *args], capture_output=True, text=True, check=True
    ).stdout


def locked(specs: list[ResolvedSpec], baseline: Baseline, waivers: list[Waiver]) -> Baseline:
    """The baseline with ``specs`` released: new fingerprints appended, latest contracts updated.

    Ids that left the specs stay in the lock: a released id can never come back incompatible.
    """
    released = dict(baseline.released)
    for spec in specs:
        released[spec.id] = released_from(spec, released.get(spec.id))
    return Baseline(released, (*baseline.waivers, *waivers), baseline.source)


def undecidable_waivers(report: Report, spec_id: str, reason: str) -> list[Waiver]:
    """Waivers for every undecidable finding of ``spec_id`` (and nothing that is decidable)."""
    return [
        Waiver(f.id, f.old_fingerprint, f.new_fingerprint, f.rule, f.path, reason)
        for f in report.findings
        if f.id == spec_id and f.undecidable and not f.waived
    ]
