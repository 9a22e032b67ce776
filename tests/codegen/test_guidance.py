"""A spec package carries guidance for its tools (seed 003: skills are ``{guidance, tools}``):
``guidance.md`` at the root of the spec tree reaches the manifest, the package and the runtime."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import EXAMPLE_SPECS
from hypothesis import given
from hypothesis import strategies as st

from blade_codegen.build import build
from blade_codegen.cli import main
from blade_codegen.export import export_specs
from blade_codegen.render import text_block

GUIDANCE = 'Read current state before making changes.\n\nNever refund more than was "captured".'


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    specs = tmp_path / "specs"
    shutil.copytree(EXAMPLE_SPECS, specs)
    (specs / "guidance.md").write_text(GUIDANCE + "\n", "utf-8")
    return specs


def test_the_manifest_carries_the_guidance_beside_the_tools(tree: Path, tmp_path: Path) -> None:
    build(tree, tmp_path / "out", "guided")
    manifest = json.loads((tmp_path / "out" / "guided" / "manifest.json").read_text("utf-8"))
    assert manifest["guidance"] == GUIDANCE
    assert len(manifest["tools"]) == 4


def test_every_spec_of_the_package_carries_its_guidance(tree: Path, tmp_path: Path) -> None:
    build(tree, tmp_path / "out", "guided")
    probe = (
        "import guided\n"
        "from guided.crm import lookup_customer_v1 as crm\n"
        "from guided.payments import refund_payment_v1 as pay\n"
        "assert crm.SPEC.guidance is pay.SPEC.guidance is guided.GUIDANCE\n"
        "print(guided.GUIDANCE, end='')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path / "out",
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == GUIDANCE


def test_guidance_output_is_deterministic_and_follows_the_file(tree: Path, tmp_path: Path) -> None:
    first = build(tree, tmp_path / "a", "guided")
    build(tree, tmp_path / "b", "guided")
    for path in ("__init__.py", "manifest.json", "crm/lookup_customer_v1.py"):
        assert (tmp_path / "a" / "guided" / path).read_bytes() == (
            tmp_path / "b" / "guided" / path
        ).read_bytes()
    assert first.status == "written"
    # editing only the guidance is a change the next build sees; removing it removes it
    (tree / "guidance.md").write_text("Be brief.\n", "utf-8")
    assert build(tree, tmp_path / "a", "guided").status == "written"
    assert 'GUIDANCE: Final[str] = "Be brief."' in (tmp_path / "a/guided/__init__.py").read_text()
    (tree / "guidance.md").unlink()
    build(tree, tmp_path / "a", "guided")
    package = tmp_path / "a" / "guided"
    assert "GUIDANCE" not in (package / "__init__.py").read_text()
    assert "GUIDANCE" not in (package / "crm" / "lookup_customer_v1.py").read_text()
    assert "guidance" not in json.loads((package / "manifest.json").read_text())


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"  \n\n", "guidance.md:1:1: /: is empty"),
        (b"caf\xe9", "guidance.md:1:1: /: is not UTF-8 (byte 3)"),
        (b"x" * (64 * 1024 + 1), "over the 65536 a model's guidance may take"),
    ],
)
def test_a_guidance_file_that_cannot_guide_is_refused(
    tree: Path, tmp_path: Path, content: bytes, said: str
) -> None:
    (tree / "guidance.md").write_bytes(content)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["build", str(tree), "--out", str(out), "--package", "g"])
    assert result.exit_code == 3, result.output
    assert said in result.output and "Traceback" not in result.output
    assert not (out / "g").exists()  # nothing half-written


def test_export_hands_the_guidance_on_where_the_format_has_a_place(tree: Path) -> None:
    blade = export_specs(tree, "blade")
    assert isinstance(blade.document, dict) and blade.document["guidance"] == GUIDANCE
    openai = export_specs(tree, "openai")
    # a bare tool list has no place for it: the export carries it for the model's instructions
    assert isinstance(openai.document, list) and openai.guidance == GUIDANCE


@given(st.text(min_size=1, max_size=400))
def test_guidance_text_is_written_as_code_that_reads_back_exactly(text: str) -> None:
    literal = text_block(text)
    assert eval(literal) == text  # our own generated literal
