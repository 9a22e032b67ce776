"""``blade-codegen pack``: a spec package as an sdist and a wheel, built by hatchling (PEP 517).

The package holds the spec files (``<package>/specs``), the manifest, the contracts lock, the
generated models, spec objects and client DTOs, ``py.typed`` and a generated README. It depends on
``blade-runtime``, pydantic and the spec packages its references name: never on the toolchain.
Packing is refused when a spec breaks the lock; a pack records the released fingerprints in it.
"""

from __future__ import annotations

import os
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Literal

from packaging.version import InvalidVersion, Version

from blade_codegen import __version__
from blade_codegen.build import compile_specs
from blade_codegen.check import lock_text, locked, read_lock
from blade_codegen.dependencies import import_name, installed
from blade_codegen.load import GUIDANCE_FILE, spec_paths
from blade_codegen.plan import BuildPlan
from blade_codegen.render import environment
from blade_codegen.resolve import resolve_specs
from blade_codegen.witness import minimal_instance
from blade_codegen.write import write_file

NAME_RULE = (
    "spec packages are named in lowercase kebab-case as blade-tool-<capability or target "
    "system>, e.g. blade-tool-crm or blade-tool-github"
)
_NAME = re.compile(r"blade-tool-[a-z0-9]+(?:-[a-z0-9]+)*")
# Labels that name no capability or system (the convention asks for one).
_GENERIC = frozenset(
    {"tool", "tools", "spec", "specs", "package", "common", "misc", "utils", "lib"}
)
# Wheels and sdists carry this timestamp, so the same specs pack to the same bytes.
_EPOCH = "1577836800"  # 2020-01-01


class PackRefused(ValueError):
    """A name or version ``pack`` does not accept; the message quotes the rule."""


@dataclass(frozen=True)
class Packed:
    sdist: Path
    wheel: Path
    tools: int
    lock: Path
    lock_changed: bool
    requires: tuple[str, ...]


def check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise PackRefused(f"--name {name!r}: {NAME_RULE}")
    if name.removeprefix("blade-tool-") in _GENERIC:
        raise PackRefused(f"--name {name!r} is a generic label: {NAME_RULE}")


def check_version(text: str) -> str:
    try:
        return str(Version(text))
    except InvalidVersion:
        raise PackRefused(f"--version {text!r} is not a PEP 440 version, e.g. 1.2.0") from None


def pack(specs: Path, name: str, version: str, out: Path, lock: Path) -> Packed:
    """Build ``name``'s sdist and wheel into ``out`` and record the release in ``lock``.

    Raises PackRefused, SpecError, BaselineError or BreakingChange before anything is written."""
    check_name(name)
    version = check_version(version)
    package = import_name(name)
    resolved = resolve_specs(specs)
    baseline = read_lock(lock)
    compiled = compile_specs(resolved, package, {}, lambda path: None, baseline)
    released = lock_text(locked(list(resolved.specs), baseline, []))
    dependencies = installed(resolved.tree)
    requires = (
        f"blade-runtime>={installed_version('blade-runtime')}",
        "pydantic>=2.14,<3",
        *(f"{d.name}>={d.version}" for d in sorted(dependencies, key=lambda d: d.name)),
    )
    files = {f"{package}/{path}": text for path, text in compiled.files.items()}
    for path in spec_paths(specs):
        files[f"{package}/specs/{path.relative_to(specs).as_posix()}"] = path.read_text("utf-8")
    if resolved.tree.guidance is not None:  # the package's specs/ builds again as it was
        files[f"{package}/specs/{GUIDANCE_FILE}"] = resolved.tree.guidance + "\n"
    files[f"{package}/blade.lock.json"] = released
    files["README.md"] = readme(compiled.plan, name, [d.label for d in dependencies])
    files["pyproject.toml"] = pyproject(name, version, package, requires, len(resolved.specs))

    with tempfile.TemporaryDirectory(prefix="blade-pack-") as scratch:
        project = Path(scratch) / "project"
        for rel, text in files.items():
            target = project / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, "utf-8")
        built = Path(scratch) / "dist"
        sdist = _build(project, "sdist", built)
        # The wheel is built from the sdist, as pip would: a file the sdist lacks fails here.
        with tarfile.open(sdist) as archive:
            archive.extractall(Path(scratch) / "sdist", filter="data")
        unpacked = next((Path(scratch) / "sdist").iterdir())
        wheel = _build(unpacked, "wheel", built)
        out.mkdir(parents=True, exist_ok=True)
        results = []
        for artifact in (sdist, wheel):
            staged = out / f".{artifact.name}.tmp"
            shutil.copyfile(artifact, staged)
            os.replace(staged, out / artifact.name)
            results.append(out / artifact.name)
    changed = not lock.exists() or lock.read_text("utf-8") != released
    if changed:
        write_file(lock, released)
    return Packed(results[0], results[1], len(resolved.specs), lock, changed, requires)


def _build(project: Path, distribution: Literal["sdist", "wheel"], out: Path) -> Path:
    """One PEP 517 build through pypa/build, with this environment's hatchling (no download)."""
    import build

    def quiet(cmd: object, cwd: str | None = None, extra_environ: object = None) -> None:
        from pyproject_hooks import quiet_subprocess_runner

        environ = {"SOURCE_DATE_EPOCH": _EPOCH, **(extra_environ or {})}  # type: ignore[dict-item]
        quiet_subprocess_runner(cmd, cwd, environ)  # type: ignore[arg-type]

    builder = build.ProjectBuilder(project, runner=quiet)
    return Path(builder.build(distribution, out))


def pyproject(name: str, version: str, package: str, requires: tuple[str, ...], count: int) -> str:
    return (
        environment()
        .get_template("package_pyproject.toml.jinja")
        .render(
            name=name,
            version=version,
            package=package,
            requires=requires,
            count=count,
            generator=f"blade-codegen {__version__}",
        )
    )


def readme(build_plan: BuildPlan, name: str, dependencies: list[str]) -> str:
    tools = build_plan.tools
    examples = []
    for tool in tools:
        valid, value = minimal_instance(tool.spec.input.bundled)
        examples.append(repr(value) if valid else None)  # a dict of JSON values: a literal
    return (
        environment()
        .get_template("package_readme.md.jinja")
        .render(
            name=name,
            package=build_plan.package,
            tools=tools,
            examples=examples,
            dependencies=dependencies,
            version=__version__,
        )
    )
