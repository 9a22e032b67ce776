"""``blade-codegen new``, ``stub`` and ``init``: the files a new tool or project starts from.

Each renders a template of ``templates/`` and writes only files that do not exist: a file already
there is reported (:class:`Exists`), never replaced.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from blade_codegen.config import DEFAULT_PACKAGE
from blade_codegen.importer import Imported, check_imported
from blade_codegen.load import SHARED_SUFFIX, spec_paths
from blade_codegen.validate import unversioned, versioned
from blade_codegen.write import new_file, write_file

EXAMPLE_ID = "example.hello.v1"
_VERSION = re.compile(r"v[0-9]+")


class Exists(Exception):
    """The file to write is already there; nothing was written."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"{path} exists; nothing was written (pick another path or remove it)")
        self.path = path


class Refused(Exception):
    """The request cannot be met (an unknown id, a client tool, a bad id): one line, a usage
    error."""


class Invalid(Exception):
    """What would be written fails validation; ``problems`` are one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def write_new(path: Path, text: str) -> None:
    """Write ``path`` whole, only if it does not exist (Exists otherwise), atomically: the text
    goes to a temporary file that is then hard-linked into place, which fails if ``path`` is
    there, even when another process created it a moment ago."""
    if path.exists():
        raise Exists(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staged = new_file(path.parent, f".{path.name}.", ".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        try:
            os.link(staged, path)
        except FileExistsError:
            raise Exists(path) from None
    finally:
        os.unlink(staged)


# -- new -----------------------------------------------------------------------------------------


def spec_rel(spec_id: str) -> str:
    """The path an id gives, relative to the spec folder: ``crm.lookup-customer.v1`` ->
    ``crm/lookup-customer.v1.json`` (the namespace is the folder)."""
    namespace, _, rest = spec_id.partition(".")
    if not namespace or not rest:
        raise Refused(
            f"id {spec_id!r} has no namespace: write it as namespace.tool-name.v1, "
            "e.g. crm.lookup-customer.v1"
        )
    if not versioned(spec_id):
        raise Refused(unversioned(spec_id))
    return f"{namespace}/{rest}.json"


def tool_name(spec_id: str) -> str:
    """The registration name an id suggests: its tool-name part, with underscores."""
    parts = spec_id.split(".")
    word = parts[-2] if len(parts) > 2 and _VERSION.fullmatch(parts[-1]) else parts[-1]
    name = re.sub(r"[^A-Za-z0-9_]", "_", word)
    return name if name[:1].isalpha() else f"t_{name}"


def new_spec(
    specs: Path,
    spec_id: str,
    package: str = DEFAULT_PACKAGE,
    template_name: str = "new_spec.json.jinja",
) -> Path:
    """Write a spec skeleton for ``spec_id`` at the path its id gives; returns that path.

    Exists if the file is there, Refused for an id without a namespace, Invalid when the
    skeleton would not build in the tree (a bad id, a name, module or client method already
    taken: the existing file is named); ``package`` only words the messages."""
    from blade_codegen.render import environment

    rel = spec_rel(spec_id)
    target = specs / rel
    if target.exists():
        raise Exists(target)
    template = environment().get_template(template_name)
    text = template.render(spec_id=spec_id, name=tool_name(spec_id))
    json.loads(text)  # the template writes JSON whatever the id holds (json_text escapes it)
    problems = check_imported(specs, [Imported(rel, text)], package)
    if problems:
        raise Invalid(problems)
    write_new(target, text)
    return target


# -- stub ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stub:
    text: str
    filename: str  # the default file name: the tool's module name, e.g. lookup_customer_v1.py


def stub(specs: Path, spec_id: str, package: str) -> Stub:
    """The implementation module for ``spec_id``: typed against the package ``package`` that
    ``blade-codegen build`` writes from ``specs``; raises SpecError, Refused."""
    import black
    from black.mode import Mode, TargetVersion

    from blade_codegen.format import LINE_LENGTH
    from blade_codegen.models import OPTIONS_SIGNATURE
    from blade_codegen.plan import plan
    from blade_codegen.render import environment
    from blade_codegen.resolve import resolve_specs

    build_plan = plan(resolve_specs(specs), package, OPTIONS_SIGNATURE)
    tools = {tool.spec.id: tool for tool in build_plan.tools}
    tool = tools.get(spec_id)
    if tool is None:
        close = difflib.get_close_matches(spec_id, list(tools), n=1)
        hint = f"did you mean {close[0]}?" if close else f"{len(tools)} spec(s) are there"
        raise Refused(f"no spec with id {spec_id!r} in {specs} ({hint})")
    spec = tool.spec
    if spec.execution == "client":
        raise Refused(
            f"{spec_id} is a client tool: a client submits its output, so the backend has "
            "nothing to implement (register it with runtime.register_client(SPEC))"
        )
    execution = tool.base + "Execution"
    output_type = tool.cls(spec.output) if spec.output else "JsonValue"
    context_class = tool.cls(spec.context) if spec.context else None
    imports = sorted(
        {execution, *(n for n in (context_class, output_type) if n and n != "JsonValue")}
    )
    taken = {"register", "SPEC", "Runtime", "CallInfo", "Callable", "JsonValue", *imports}
    function = tool.method if tool.method not in taken else f"{tool.method}_impl"
    text = (
        environment()
        .get_template("stub_module.py.jinja")
        .render(
            spec=spec,
            module=f"{package}.{tool.module}",
            function=function,
            execution=execution,
            output_type=output_type,
            input_class=tool.cls(spec.input),
            context_class=context_class,
            imports=imports,
            channels=[(slot.key, tool.cls(slot)) for slot in spec.data],
            points=[
                (point.key, tool.cls(point), tool.cls(resume)) for point, resume in spec.suspend
            ],
            children=spec.children,
        )
    )
    # black's default line length, as the generated modules use: a user's default ruff agrees.
    mode = Mode(line_length=LINE_LENGTH, target_versions={TargetVersion.PY311})
    return Stub(black.format_str(text, mode=mode), tool.module.rsplit(".", 1)[-1] + ".py")


# -- init ----------------------------------------------------------------------------------------


def init_project(root: Path, specs: str, out: str, package: str) -> list[str]:
    """Set up ``root`` for blade-codegen: ``[tool.blade-codegen]`` in pyproject.toml, the spec
    folder with an example spec (and quickstart.py, which runs it), and the output folder
    ignored in git. What is already there stays (settings already in pyproject.toml win);
    returns one line per thing done."""
    from blade_codegen.config import settings
    from blade_codegen.render import environment

    done: list[str] = []
    pyproject = root / "pyproject.toml"
    section = (
        environment()
        .get_template("init_pyproject.toml.jinja")
        .render(specs=specs, out=out, package=package)
    )
    if not pyproject.exists():
        write_file(pyproject, section.lstrip("\n"))
        done.append(f"wrote {pyproject} with [tool.blade-codegen]")
    else:
        text = pyproject.read_text("utf-8")
        try:
            present = "blade-codegen" in tomllib.loads(text).get("tool", {})
        except tomllib.TOMLDecodeError as error:
            raise Refused(f"{pyproject}: not TOML ({error}); fix it, then run init again") from None
        if present:
            done.append(f"kept [tool.blade-codegen] of {pyproject}")
        else:
            separator = "" if text.endswith("\n") or not text else "\n"
            write_file(pyproject, text + separator + section)
            done.append(f"added [tool.blade-codegen] to {pyproject}")
    found = settings(root)
    found.specs.mkdir(parents=True, exist_ok=True)
    own = [p for p in spec_paths(found.specs) if not p.name.endswith(SHARED_SUFFIX)]
    if not own:
        example = new_spec(found.specs, EXAMPLE_ID, found.package, "init_example_spec.json.jinja")
        done.append(f"wrote the example spec {example}")
        done.extend(_quickstart(root, found.out, found.package))
    else:  # a project with specs of its own gets no example (nor its quick start)
        done.append(f"kept the {len(own)} spec file(s) in {found.specs}: no example written")
    done.extend(_ignore(root / ".gitignore", found.out, root))
    return done


def _quickstart(root: Path, out: Path, package: str) -> list[str]:
    """quickstart.py beside pyproject.toml: the example spec's implementation, one call and one
    suspension answered (the README's quick start runs it). Written only with the example, whose
    module it imports; one already there is kept."""
    from blade_codegen.render import environment

    target = root / "quickstart.py"
    try:
        folder = os.path.relpath(out, root)
    except ValueError:  # another drive (Windows): the absolute path says it
        folder = str(out)
    text = (
        environment()
        .get_template("init_quickstart.py.jinja")
        .render(package=package, out=Path(folder).as_posix())
    )
    try:
        write_new(target, text)
    except Exists:
        return [f"kept {target}"]
    return [f"wrote {target}: run it after the build (PYTHONPATH={folder} python quickstart.py)"]


def _ignore(gitignore: Path, out: Path, root: Path) -> list[str]:
    try:
        entry = "/" + out.resolve().relative_to(root.resolve()).as_posix() + "/"
    except ValueError:
        return []  # outside the project: not this repository's to ignore
    text = gitignore.read_text("utf-8") if gitignore.exists() else ""
    bare = entry.strip("/")
    if any(line.strip().strip("/") == bare for line in text.splitlines()):
        return []
    separator = "" if text.endswith("\n") or not text else "\n"
    write_file(gitignore, f"{text}{separator}# blade-codegen build output\n{entry}\n")
    return [f"ignored {entry} in {gitignore}"]
