"""The command line: exit codes, messages without tracebacks, defaults from pyproject.toml."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import EXAMPLE_SPECS, ROOT, add_spec, spec

from blade_codegen import __version__
from blade_codegen.cli import main


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(EXAMPLE_SPECS, tmp_path / "tools")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.blade-codegen]\nspecs = "tools"\nout = "build/gen"\npackage = "acme_tools"\n',
        "utf-8",
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_build_uses_pyproject_defaults_then_check(project: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["build"])
    assert result.exit_code == 0, result.output
    assert (project / "build" / "gen" / "acme_tools" / "manifest.json").is_file()
    again = runner.invoke(main, ["build", "--check"])
    assert again.exit_code == 0 and "up to date" in again.output
    add_spec(project / "tools", spec("extra.more.v1"))
    stale = runner.invoke(main, ["build", "--check"])
    assert stale.exit_code == 1
    assert "extra/more_v1.py" in stale.output


def test_invalid_specs_exit_3_with_one_line_each_and_no_traceback(project: Path) -> None:
    add_spec(project / "tools", spec("extra.bad.v1", name="no spaces", kind="x"))
    result = CliRunner().invoke(main, ["build"])
    assert result.exit_code == 3
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert any(line.startswith("extra/bad.v1.json:") and "/name:" in line for line in lines)
    assert any("/kind:" in line for line in lines)
    assert lines[-1] == "2 problems in 1 file(s); nothing was written"
    assert not (project / "build").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["build", "nowhere"], "no spec folder at nowhere"),
        (["build", "--package", "not-a-name"], "is not a Python package name"),
        (["build", "--package", "class"], "is not a Python package name"),
        (["frobnicate"], "No such command"),
    ],
)
def test_usage_errors_exit_2(project: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_unwritable_output_exits_4(project: Path) -> None:
    (project / "build").write_text("a file where the output folder should be", "utf-8")
    result = CliRunner().invoke(main, ["build"])
    assert result.exit_code == 4, result.output
    assert result.output.startswith("error: cannot write")


def test_schema_prints_the_meta_schema_and_version(project: Path) -> None:
    result = CliRunner().invoke(main, ["schema"])
    assert result.exit_code == 0
    meta = json.loads(result.output)
    assert meta["required"] == ["id", "name", "description", "inputSchema"]
    version = CliRunner().invoke(main, ["--version"])
    assert __version__ in version.output


def test_example_specs_validate_against_the_printed_meta_schema() -> None:
    import jsonschema

    meta = json.loads(CliRunner().invoke(main, ["schema"]).output)
    for path in EXAMPLE_SPECS.rglob("*.json"):
        if not path.name.endswith(".schema.json"):
            jsonschema.Draft202012Validator(meta).validate(json.loads(path.read_text("utf-8")))


def test_blade_runtime_version_and_plain_help(capsys: pytest.CaptureFixture[str]) -> None:
    from blade_runtime import __version__ as runtime_version
    from blade_runtime.serving.cli import main as runtime_main

    with pytest.raises(SystemExit) as version:
        runtime_main(["--version"])
    assert version.value.code == 0
    assert capsys.readouterr().out.strip() == f"blade-runtime {runtime_version}"
    with pytest.raises(SystemExit):
        runtime_main(["--help"])
    text = capsys.readouterr().out
    assert "``" not in text  # no raw reST
    assert "blade-runtime pending submit ACTION_ID" in text  # the usage lines keep their lines
    with pytest.raises(SystemExit):
        runtime_main(["pending", "cancel", "--help"])
    assert "(default: cancelled by an operator)" in " ".join(capsys.readouterr().out.split())


def test_pre_commit_hooks_run_their_commands(project: Path) -> None:
    import shlex

    import yaml

    hooks = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    assert set(hooks) == {"blade-codegen-build-check", "blade-codegen-check"}
    for hook in hooks.values():
        assert hook["language"] == "system" and hook["pass_filenames"] is False
        assert {"name", "entry", "files"} <= set(hook)
    runner = CliRunner()
    assert runner.invoke(main, ["lock"]).exit_code == 0
    assert runner.invoke(main, ["build"]).exit_code == 0
    for hook in hooks.values():
        program, *args = shlex.split(hook["entry"])
        assert program == "blade-codegen"
        result = runner.invoke(main, args)
        assert result.exit_code == 0, (hook["id"], result.output)
    add_spec(project / "tools", spec("extra.more.v1"))
    stale = runner.invoke(main, shlex.split(hooks["blade-codegen-build-check"]["entry"])[1:])
    assert stale.exit_code == 1


def test_help_lists_whole_summaries_and_shows_defaults() -> None:
    runner = CliRunner()
    listing = runner.invoke(main, ["--help"]).output
    assert "..." not in listing.split("Commands:")[1]
    words = " ".join(listing.split())
    assert "stub Write a typed implementation module for the tool ID, never over an existing" in (
        words
    )
    for command in main.commands.values():
        assert (command.help or "").split("\n")[0].split(". ")[0].split()[0] in words
    build_help = " ".join(runner.invoke(main, ["build", "--help"]).output.split())
    assert "[default: [tool.blade-codegen] out, else generated/]" in build_help
    assert "[default: [tool.blade-codegen] package, else blade_specs]" in build_help
    assert "[default: blade.lock.json beside SPECS_DIR]" in build_help
    check_help = " ".join(runner.invoke(main, ["check", "--help"]).output.split())
    assert "[default: lock]" in check_help and "[default: text]" in check_help
    pack_help = " ".join(runner.invoke(main, ["pack", "--help"]).output.split())
    assert "[default: dist]" in pack_help
