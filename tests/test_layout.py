"""The layout: both distributions are installed editable from this checkout (an edit to a module or
a template takes effect without reinstalling), and both still build as wheels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import ROOT

from blade_codegen.pack import _build

# What a fresh interpreter of this environment resolves, away from the checkout's folder and
# without PYTHONPATH: only the editable installation can point it at the checkout.
PROBE = """
import json, importlib.util
from blade_codegen.render import _templates_dir
print(json.dumps({
    "blade_codegen": importlib.util.find_spec("blade_codegen").origin,
    "blade_runtime": importlib.util.find_spec("blade_runtime").origin,
    "templates": str(_templates_dir()),
}))
"""


def test_the_installation_runs_the_checkout_s_modules_and_templates(tmp_path: Path) -> None:
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(done.stdout)
    assert Path(found["blade_codegen"]) == ROOT / "codegen" / "blade_codegen" / "__init__.py"
    assert Path(found["blade_runtime"]) == ROOT / "runtime" / "blade_runtime" / "__init__.py"
    assert Path(found["templates"]) == ROOT / "templates"  # an edited template is the one used


def test_both_distributions_build_as_wheels_with_every_template(tmp_path: Path) -> None:
    toolchain = _build(ROOT, "wheel", tmp_path)
    with zipfile.ZipFile(toolchain) as wheel:
        names = set(wheel.namelist())
    templates = {f"blade_codegen/templates/{p.name}" for p in (ROOT / "templates").glob("*.jinja")}
    assert templates and templates <= names
    assert "blade_codegen/spec.schema.json" in names and "blade_codegen/stubs.py" in names
    assert not any(n.startswith(("blade_runtime/", "tests/", "specs/")) for n in names)
    runtime = _build(ROOT / "runtime", "wheel", tmp_path)
    with zipfile.ZipFile(runtime) as wheel:
        runtime_names = set(wheel.namelist())
    assert (
        "blade_runtime/__init__.py" in runtime_names and "blade_runtime/py.typed" in runtime_names
    )
    assert not any(n.startswith("blade_codegen/") for n in runtime_names)
