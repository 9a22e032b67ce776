"""`blade-codegen lock` and `check`: released contracts, spec-level rules, messages, git."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLE_SPECS, add_spec, run_cli, spec, write_json

from blade_codegen.check import Baseline, check, read_lock, released_from
from blade_codegen.resolve import resolve_specs


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the example specs in ``project/specs``, locked as released."""
    shutil.copytree(EXAMPLE_SPECS, tmp_path / "specs")
    done = cli("lock", str(tmp_path / "specs"))
    assert done.returncode == 0, done.stderr
    return tmp_path


def edit(project: Path, rel: str, change: Any) -> None:
    path = project / "specs" / rel
    data = json.loads(path.read_text("utf-8"))
    change(data)
    write_json(path, data)


def test_the_lock_is_deterministic_and_reviewable(project: Path) -> None:
    lock = project / "blade.lock.json"
    first = lock.read_bytes()
    data = json.loads(first)
    assert sorted(data["specs"]) == [
        "browser.check-page.v1",
        "crm.lookup-customer.v1",
        "deploy.deploy-service.v1",
        "payments.refund-payment.v1",
    ]
    refund = data["specs"]["payments.refund-payment.v1"]
    assert refund["suspendPoints"] == ["approval"] and len(refund["fingerprints"]) == 1
    assert data["specs"]["deploy.deploy-service.v1"]["dataChannels"] == ["log", "progress"]
    assert "description" not in json.dumps(refund["latest"])  # annotations are not the contract
    assert cli("lock", str(project / "specs")).stdout.endswith("is up to date\n")
    lock.unlink()
    assert cli("lock", str(project / "specs")).returncode == 0
    assert lock.read_bytes() == first


def test_unchanged_and_annotation_only_edits_are_compatible(project: Path) -> None:
    done = cli("check", str(project / "specs"))
    assert (
        done.returncode == 0
        and "compatible: 0 changed spec(s) compared, 4 unchanged" in done.stderr
    )

    def describe(data: dict[str, Any]) -> None:
        data["description"] = "Reworded."
        data["inputSchema"]["properties"]["email"]["description"] = "The email."

    edit(project, "crm/lookup-customer.v1.json", describe)
    assert cli("check", str(project / "specs")).returncode == 0


@pytest.mark.parametrize(
    "new_type, example",
    [("string", '{"found": "x"}'), (["boolean", "null"], '{"found": null}')],
)
def test_a_type_change_is_shown_with_a_value_of_the_type_not_its_name(
    project: Path, new_type: Any, example: str
) -> None:
    """The example of a TYPE_ or NULL_ finding is a value of a type, never the type's name
    as a string (it read `e.g. {"ok": "boolean"}`)."""

    def retype(data: dict[str, Any]) -> None:
        data["outputSchema"]["properties"]["found"]["type"] = new_type

    edit(project, "crm/lookup-customer.v1.json", retype)
    line = cli("check", str(project / "specs")).stdout.strip()
    assert f"e.g. {example}" in line and '"boolean"}' not in line, line


def test_a_breaking_change_names_everything_and_the_fix(project: Path) -> None:
    def narrow(data: dict[str, Any]) -> None:
        data["inputSchema"]["properties"]["environment"]["enum"] = ["staging"]

    edit(project, "deploy/deploy-service.v1.json", narrow)
    done = cli("check", str(project / "specs"))
    assert done.returncode == 1
    line = done.stdout.strip()
    assert line.startswith(
        "deploy/deploy-service.v1.json: deploy.deploy-service.v1: input /environment:"
    )
    for fragment in (
        "ENUM_VALUE_REMOVED",
        '["staging", "production"] -> ["staging"]',
        "breaks callers (it accepts less)",
        'e.g. {"environment": "production"',
        "fix: publish it as deploy.deploy-service.v2 and keep deploy.deploy-service.v1",
    ):
        assert fragment in line, line
    machine = json.loads(cli("check", str(project / "specs"), "--format", "json").stdout)
    assert machine["compatible"] is False
    [finding] = machine["findings"]
    assert finding["rule"] == "ENUM_VALUE_REMOVED" and finding["breaks"] == ["accepting"]
    assert finding["part"] == "input" and finding["path"] == "/environment"
    # The lock refuses it and stays as it was; so does the build.
    before = (project / "blade.lock.json").read_bytes()
    assert cli("lock", str(project / "specs")).returncode == 1
    assert (project / "blade.lock.json").read_bytes() == before
    built = cli("build", str(project / "specs"), "--out", str(project / "out"))
    assert built.returncode == 5 and "ENUM_VALUE_REMOVED" in built.stderr
    assert not (project / "out").exists()
    forced = cli("build", str(project / "specs"), "--out", str(project / "out"), "--allow-breaking")
    assert forced.returncode == 0, forced.stderr


def test_each_part_is_checked_in_its_own_direction(project: Path) -> None:
    def change(data: dict[str, Any]) -> None:
        data["outputSchema"]["properties"]["steps"]["minimum"] = -1  # output: emits more
        data["dataSchemas"]["progress"]["properties"]["status"]["enum"].append("skipped")
        data["inputSchema"]["properties"]["canary_percent"]["maximum"] = 200  # accepts more: fine

    edit(project, "deploy/deploy-service.v1.json", change)
    findings = json.loads(cli("check", str(project / "specs"), "--format", "json").stdout)
    parts = {(f["part"], f["rule"], tuple(f["breaks"])) for f in findings["findings"]}
    assert parts == {
        ("output", "MIN_DECREASED", ("emitting",)),
        ("data channel 'progress'", "ENUM_VALUE_ADDED", ("emitting",)),
    }


def test_an_effect_is_checked_as_what_the_tool_emits(project: Path) -> None:
    """A subscriber reads a tool's effects: one that may now be emitted where it could not
    before breaks it (a message's text may be empty), one emitted less does not."""

    def change(data: dict[str, Any]) -> None:
        del data["effects"]["message"]["properties"]["text"]["minLength"]
        data["effects"]["context"]["properties"]["deployed"]["additionalProperties"] = {
            "type": "string"  # no null: the tool emits less
        }

    edit(project, "deploy/deploy-service.v1.json", change)
    findings = json.loads(cli("check", str(project / "specs"), "--format", "json").stdout)
    parts = {(f["part"], tuple(f["breaks"])) for f in findings["findings"]}
    assert parts == {("effect 'message'", ("emitting",))}, findings


def test_suspend_points_resume_payloads_and_execution_mode(project: Path) -> None:
    def change(data: dict[str, Any]) -> None:
        resume = data["suspend"]["approval"]["resumeSchema"]
        resume["required"].append("note")  # resume payloads are accepted: narrowing breaks
        data["suspend"]["second"] = {"suspendSchema": {"type": "object"}, "resumeSchema": {}}

    edit(project, "payments/refund-payment.v1.json", change)
    edit(project, "browser/check-page.v1.json", lambda d: d.update(execution="backend"))
    report = json.loads(cli("check", str(project / "specs"), "--format", "json").stdout)
    rules = {(f["id"], f["part"], f["rule"]) for f in report["findings"]}
    assert ("payments.refund-payment.v1", "spec", "SUSPEND_POINT_ADDED") in rules
    assert (
        "payments.refund-payment.v1",
        "suspend point 'approval' resume",
        "PROPERTY_MADE_REQUIRED",
    ) in rules
    assert ("browser.check-page.v1", "spec", "EXECUTION_CHANGED") in rules


def test_client_tools_check_input_and_output_both_ways(project: Path) -> None:
    def change(data: dict[str, Any]) -> None:
        data["outputSchema"]["properties"]["status"] = {"type": "integer", "minimum": 100}

    edit(project, "browser/check-page.v1.json", change)
    report = json.loads(cli("check", str(project / "specs"), "--format", "json").stdout)
    output = [f for f in report["findings"] if f["part"] == "output"]
    # An optional property on an open object narrows what is accepted: harmless for an output
    # the backend emits, breaking for the output a client submits.
    assert [f["breaks"] for f in output] == [["accepting"]]
    specs = resolve_specs(project / "specs").specs
    baseline = read_lock(project / "blade.lock.json")
    client = next(s for s in specs if s.id == "browser.check-page.v1")
    assert any("accepting" in f.directions for f in check([client], baseline).findings)


def test_removing_an_id_needs_a_released_deprecation(project: Path) -> None:
    (project / "specs" / "crm" / "lookup-customer.v1.json").unlink()
    done = cli("check", str(project / "specs"))
    assert done.returncode == 1 and "ID_REMOVED" in done.stdout
    shutil.copytree(EXAMPLE_SPECS / "crm", project / "specs" / "crm", dirs_exist_ok=True)
    edit(project, "crm/lookup-customer.v1.json", lambda d: d.update(deprecated=True))
    assert cli("lock", str(project / "specs")).returncode == 0
    (project / "specs" / "crm" / "lookup-customer.v1.json").unlink()
    assert cli("check", str(project / "specs")).returncode == 0
    assert cli("lock", str(project / "specs")).returncode == 0  # the lock keeps the removed id
    # Once released, the id never comes back with an incompatible contract.
    shutil.copytree(EXAMPLE_SPECS / "crm", project / "specs" / "crm", dirs_exist_ok=True)

    def narrow(data: dict[str, Any]) -> None:
        data["inputSchema"]["properties"]["include"]["items"]["enum"] = ["orders"]

    edit(project, "crm/lookup-customer.v1.json", narrow)
    assert cli("lock", str(project / "specs")).returncode == 1
    assert "ENUM_VALUE_REMOVED" in cli("check", str(project / "specs")).stdout


def test_a_removed_data_channel_name_cannot_come_back(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    record = {"type": "object", "properties": {"n": {"type": "integer"}}}
    add_spec(specs, spec("t.tool.v1", dataSchemas={"progress": record}))
    assert cli("lock", str(specs)).returncode == 0
    add_spec(specs, spec("t.tool.v1"))
    assert cli("lock", str(specs)).returncode == 0  # dropping a channel is allowed
    add_spec(specs, spec("t.tool.v1", dataSchemas={"progress": {"type": "string"}}))
    done = cli("check", str(specs))
    assert done.returncode == 1 and "DATA_CHANNEL_NAME_REUSED" in done.stdout


def test_undecidable_changes_break_until_waived_for_both_fingerprints(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    pattern = {"type": "object", "properties": {"q": {"type": "string", "pattern": "^[a-z]+$"}}}
    add_spec(specs, spec("t.tool.v1", inputSchema=pattern))
    assert cli("lock", str(specs)).returncode == 0
    pattern["properties"]["q"]["pattern"] = "^[a-z0-9]+$"
    add_spec(specs, spec("t.tool.v1", inputSchema=pattern))
    done = cli("check", str(specs))
    assert done.returncode == 1 and "PATTERN_CHANGED" in done.stdout
    assert "undecidable, treated as breaking" in done.stdout
    assert cli("lock", str(specs), "--waive", "t.tool.v1").returncode == 2  # a reason is required
    waived = cli("lock", str(specs), "--waive", "t.tool.v1", "--reason", "digits were always sent")
    assert waived.returncode == 0, waived.stderr
    lock = json.loads((tmp_path / "blade.lock.json").read_text())
    [waiver] = lock["waivers"]
    assert waiver["rule"] == "PATTERN_CHANGED" and waiver["old"] != waiver["new"]
    assert lock["specs"]["t.tool.v1"]["fingerprints"] == [waiver["old"], waiver["new"]]
    assert cli("check", str(specs)).returncode == 0


def test_bad_baselines_and_usage(tmp_path: Path, project: Path) -> None:
    (project / "blade.lock.json").write_text("{not json")
    done = cli("check", str(project / "specs"))
    assert done.returncode == 3 and "not a readable lock file" in done.stderr
    assert "Traceback" not in done.stderr
    assert cli("check", str(project / "specs"), "--against", "svn:1").returncode == 2
    broken = tmp_path / "broken"
    add_spec(broken, spec("t.tool.v1", inputSchema={"type": "array"}))
    assert cli("check", str(broken)).returncode == 3


def _emptied_latest(lock: dict[str, Any]) -> None:
    lock["specs"]["crm.lookup-customer.v1"]["latest"] = {}


def _bad_schema(lock: dict[str, Any]) -> None:
    lock["specs"]["crm.lookup-customer.v1"]["latest"]["schemas"]["input"] = {"type": 5}


@pytest.mark.parametrize(
    ("break_lock", "where"),
    [
        (lambda lock: [], "/: "),
        (lambda lock: {**lock, "specs": []}, "/specs: "),
        (lambda lock: {**lock, "waivers": [{"id": "x"}]}, "/waivers/0: "),
        (_emptied_latest, "/specs/crm.lookup-customer.v1/latest: "),
        (_bad_schema, "/specs/crm.lookup-customer.v1/latest/schemas/input/type: "),
    ],
)
def test_a_lock_of_the_wrong_shape_is_exit_3_naming_the_place_and_the_fix(
    project: Path, break_lock: Any, where: str
) -> None:
    lock = project / "blade.lock.json"
    data = json.loads(lock.read_text("utf-8"))
    changed = break_lock(data)
    write_json(lock, data if changed is None else changed)
    before = lock.read_bytes()
    specs = str(project / "specs")
    for args in (("check", specs), ("lock", specs), ("build", specs, "--out", str(project / "o"))):
        done = cli(*args)
        assert done.returncode == 3, (args, done.stderr)
        [line] = done.stderr.splitlines()
        assert line.startswith(f"error: {lock}:") and f": {where}not a lock file: " in line, line
        assert line.endswith("never edit it by hand)"), line
    assert lock.read_bytes() == before and not (project / "o").exists()


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def test_against_a_git_revision(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE_SPECS, repo / "specs")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "release")
    edit(
        repo,
        "deploy/deploy-service.v1.json",
        lambda d: d["inputSchema"]["required"].append("canary_percent"),
    )
    done = cli("check", str(repo / "specs"), "--against", "git:HEAD")
    assert done.returncode == 1, done.stderr
    assert "PROPERTY_MADE_REQUIRED" in done.stdout and "git:HEAD" in done.stderr
    missing = cli("check", str(repo / "specs"), "--against", "git:no-such-ref")
    assert missing.returncode == 3 and "git:no-such-ref" in missing.stderr
    [line] = missing.stderr.splitlines()
    assert "not a valid object name" in line and "name a branch, tag or commit" in line
    # A ref that git would read as an option is refused before git runs.
    option = cli("check", str(repo / "specs"), "--against", f"git:--output={tmp_path / 'x'}")
    assert option.returncode == 2 and not (tmp_path / "x").exists()


def test_against_git_outside_a_repository_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    specs = tmp_path / "specs"
    shutil.copytree(EXAMPLE_SPECS, specs)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # wherever tmp_path lies
    done = cli("check", str(specs), "--against", "git:main")
    assert done.returncode == 3, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("error: git:main: fatal: not a git repository"), line
    assert line.endswith("or compare with the lock: --against lock)")


def test_released_history_keeps_every_fingerprint(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    closed = {
        "type": "object",
        "properties": {"q": {"type": "string"}},
        "additionalProperties": False,
    }
    add_spec(specs, spec("t.tool.v1", inputSchema=closed))
    first = resolve_specs(specs).specs[0]
    wider = {**closed, "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}}
    add_spec(specs, spec("t.tool.v1", inputSchema=wider))
    second = resolve_specs(specs).specs[0]
    history = released_from(second, released_from(first))
    assert history.fingerprints == (first.fingerprint, second.fingerprint)
    # A closed input gains an optional property: every old call is still accepted.
    assert check([second], Baseline({"t.tool.v1": released_from(first)})).findings == []


def test_the_example_packages_lock_is_current() -> None:
    done = cli("lock", str(EXAMPLE_SPECS), "--lock", str(EXAMPLE_SPECS.parent / "blade.lock.json"))
    assert done.returncode == 0 and done.stdout.endswith("is up to date\n"), done.stdout


def test_a_missing_lock_is_exit_3_naming_it_and_the_first_release_is_one_command(
    tmp_path: Path,
) -> None:
    specs = tmp_path / "specs"
    shutil.copytree(EXAMPLE_SPECS, specs)
    typo = tmp_path / "blade.lok.json"
    for args in (
        ("check", str(specs)),  # nothing released yet: check compares with nothing
        ("check", str(specs), "--lock", str(typo)),
        ("lock", str(specs), "--lock", str(typo)),
        ("build", str(specs), "--out", str(tmp_path / "out"), "--lock", str(typo)),
        ("pack", str(specs), "--name", "blade-tool-x", "--version", "1.0.0", "--lock", str(typo)),
    ):
        done = cli(*args)
        assert done.returncode == 3, (args, done.stdout, done.stderr)
        assert "no lock file at" in done.stderr and "blade-codegen lock" in done.stderr, args
        assert "Traceback" not in done.stderr
    assert (
        not typo.exists() and not (tmp_path / "out").exists() and not (tmp_path / "dist").exists()
    )
    first = cli("lock", str(specs))  # the first release: one command, the default lock
    assert first.returncode == 0 and "first release" in first.stdout, first.stderr
    assert cli("check", str(specs)).returncode == 0
    elsewhere = cli("lock", str(specs), "--lock", str(typo), "--init")
    assert elsewhere.returncode == 0 and typo.is_file()
    assert typo.read_bytes() == (tmp_path / "blade.lock.json").read_bytes()


def test_an_empty_spec_folder_builds_nothing(tmp_path: Path) -> None:
    empty = tmp_path / "specs"
    write_json(empty / "common" / "money.schema.json", {"type": "object"})  # shared files only
    for args in (
        ("build", str(empty), "--out", str(tmp_path / "out")),
        ("pack", str(empty), "--name", "blade-tool-x", "--version", "1.0.0"),
    ):
        done = cli(*args)
        assert done.returncode == 3 and "no spec files" in done.stderr, args
    assert not (tmp_path / "out").exists()
