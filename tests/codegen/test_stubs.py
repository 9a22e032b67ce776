"""`blade-codegen new`, `stub` and `init`: starting files that are valid, typed and never
written over existing ones."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import EXAMPLE_SPECS, add_spec, import_generated, run_cli, run_mypy, run_ruff, spec

from blade_codegen.build import build

# A tool without an output schema (its output is any JSON value), with two data channels and a
# child; and one whose name would shadow the stub's own register function.
EXTRA = [
    spec(
        "ops.sweep.v1",
        dataSchemas={"log": {"type": "string"}, "progress": {"type": "integer"}},
        children=["crm.lookup-customer.v1"],
    ),
    spec("ops.register.v1"),
]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example specs plus EXTRA, built into PROJECT/out/blade_specs."""
    tmp_path = tmp_path_factory.mktemp("stubs")
    specs = tmp_path / "specs"
    shutil.copytree(EXAMPLE_SPECS, specs)
    for extra in EXTRA:
        add_spec(specs, extra)
    build(specs, tmp_path / "out", "blade_specs")
    return tmp_path


BACKEND_TOOLS = [
    "crm.lookup-customer.v1",
    "deploy.deploy-service.v1",
    "payments.refund-payment.v1",
    "ops.sweep.v1",
    "ops.register.v1",
]


def test_stubs_pass_mypy_strict_and_ruff_as_written(project: Path) -> None:
    out = project / "out"
    written = []
    for spec_id in BACKEND_TOOLS:
        done = run_cli("stub", spec_id, "--specs", str(project / "specs"), cwd=out)
        assert done.returncode == 0, done.stderr
        written.append(out / done.stdout.split()[1].rstrip(":"))
    refund = (out / "refund_payment_v1.py").read_text()
    assert "raise NotImplementedError" in refund
    assert 'ctx.suspend("approval", RefundPaymentApprovalSuspend(...))' in refund
    assert "context: Callable[[CallInfo], RefundPaymentContext]" in refund
    sweep = (out / "sweep_v1.py").read_text()
    assert "-> JsonValue:" in sweep
    assert 'await ctx.data.write("log", SweepLogData(...))' in sweep
    assert 'await ctx.data.write("progress", SweepProgressData(...))' in sweep
    assert 'Child tool "crm.lookup-customer.v1"' in sweep
    assert "async def register_impl(" in (out / "register_v1.py").read_text()
    deploy = (out / "deploy_service_v1.py").read_text()  # a fenced tool, one permission subject
    assert "#     await ctx.lease.assert_held()" in deploy
    assert '#     answer = await ctx.request_permission("...", subject="production")' in deploy
    assert "lease" not in refund
    checked = run_mypy(*written, cwd=out)
    assert checked.returncode == 0, checked.stdout
    linted = run_ruff(*written)
    assert linted.returncode == 0, linted.stdout


def test_stub_never_overwrites_and_refuses_what_it_cannot_write(project: Path) -> None:
    target = project / "impl.py"
    target.write_text("# mine\n")
    specs = str(project / "specs")
    done = run_cli("stub", "crm.lookup-customer.v1", "--specs", specs, "--out", str(target))
    assert done.returncode == 1 and "exists; nothing was written" in done.stderr
    assert target.read_text() == "# mine\n"
    client = run_cli("stub", "browser.check-page.v1", "--specs", specs, "--out", str(target))
    assert client.returncode == 2 and "client tool" in client.stderr
    typo = run_cli("stub", "crm.lookup-customer.v2", "--specs", specs, "--out", str(target))
    assert typo.returncode == 2 and "did you mean crm.lookup-customer.v1?" in typo.stderr


def test_new_writes_a_valid_skeleton_at_the_path_of_its_id(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    done = run_cli("new", "crm.find-order.v1", "--specs", str(specs))
    assert done.returncode == 0, done.stderr
    path = specs / "crm" / "find-order.v1.json"
    data = json.loads(path.read_text())
    assert data["id"] == "crm.find-order.v1" and data["name"] == "find_order"
    assert build(specs, tmp_path / "out", "blade_specs").status == "written"
    before = path.read_bytes()
    again = run_cli("new", "crm.find-order.v1", "--specs", str(specs))
    assert again.returncode == 1 and path.read_bytes() == before
    taken = run_cli("new", "sales.find-order.v1", "--specs", str(specs))  # the name is taken
    assert taken.returncode == 3 and "'find_order' is already used" in taken.stderr
    assert not (specs / "sales").exists()
    assert run_cli("new", "nonamespace", "--specs", str(specs)).returncode == 2
    unversioned = run_cli("new", "crm.cancel-order", "--specs", str(specs))
    assert unversioned.returncode == 2 and not (specs / "crm" / "cancel-order.json").exists()
    assert "has no version: end it with .v1 (crm.cancel-order.v1)" in unversioned.stderr
    assert "Traceback" not in unversioned.stderr  # click's usage error: exit 2, one Error line
    quoted = run_cli("new", 'crm.say-"hi".v1', "--specs", str(specs))  # spec text stays JSON
    assert quoted.returncode == 0, quoted.stderr
    assert json.loads((specs / "crm" / 'say-"hi".v1.json').read_text())["id"] == 'crm.say-"hi".v1'


def test_init_sets_up_a_project_once_and_keeps_what_is_there(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "app"\n')
    (tmp_path / ".gitignore").write_text("*.pyc")
    done = run_cli("init", "--package", "app_tools", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    config = tomllib.loads((tmp_path / "pyproject.toml").read_text())
    assert config["project"] == {"name": "app"}
    assert config["tool"]["blade-codegen"] == {
        "specs": "specs",
        "out": "generated",
        "package": "app_tools",
    }
    assert (
        tmp_path / ".gitignore"
    ).read_text() == "*.pyc\n# blade-codegen build output\n/generated/\n"
    assert (tmp_path / "specs" / "example" / "hello.v1.json").is_file()
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    again = run_cli("init", cwd=tmp_path)
    assert again.returncode == 0 and "kept [tool.blade-codegen]" in again.stdout
    assert "kept the 1 spec file(s) in" in again.stdout  # it says what it left alone
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files
    built = run_cli("build", cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "generated" / "app_tools" / "example" / "hello_v1.py").is_file()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "pyproject.toml").write_text("[project\n")
    broken = run_cli("init", cwd=tmp_path / "bad")
    assert broken.returncode == 2 and "not TOML" in broken.stderr


def test_init_writes_a_quickstart_that_answers_a_call_and_a_suspension(tmp_path: Path) -> None:
    """The README's quick start: init, build, then quickstart.py run as it says, beside the
    generated package (PYTHONPATH=generated); it passes mypy --strict as written."""
    done = run_cli("init", "--package", "my_tools", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    quickstart = tmp_path / "quickstart.py"
    assert f"wrote {quickstart}" in done.stdout
    assert "from my_tools.example.hello_v1 import" in quickstart.read_text()
    assert run_cli("build", cwd=tmp_path).returncode == 0
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environment["PYTHONPATH"] = str(tmp_path / "generated")
    ran = subprocess.run(
        [sys.executable, str(quickstart)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "{'greeting': 'Hello, Ada!'}",
        "hello.confirm question='Greet Grace?'",
        "{'greeting': 'Hello, Grace!', 'approved_by': 'you'}",
    ]
    checked = run_mypy(quickstart, cwd=tmp_path / "generated")
    assert checked.returncode == 0, checked.stdout
    quickstart.write_text("# mine\n")
    shutil.rmtree(tmp_path / "specs")
    again = run_cli("init", cwd=tmp_path)  # the example again, and the user's quickstart kept
    assert again.returncode == 0 and f"kept {quickstart}" in again.stdout
    assert quickstart.read_text() == "# mine\n"


def test_the_readmes_project_flow_stays_green_in_ci(tmp_path: Path) -> None:
    """init, new, build, lock, then CI's build --check: the lock is new to the build's record,
    but the code is the same, so the output is not stale (it was: exit 1 naming the record)."""
    for step in (["init"], ["new", "crm.find-order.v1"], ["build"], ["lock"]):
        done = run_cli(*step, cwd=tmp_path)
        assert done.returncode == 0, (step, done.stderr)
    checked = run_cli("build", "--check", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    spec = tmp_path / "specs" / "crm" / "find-order.v1.json"
    spec.write_text(spec.read_text().replace('"description": "', '"description": "Now: ', 1))
    stale = run_cli("build", "--check", cwd=tmp_path)  # a change that is output still is
    assert stale.returncode == 1 and "stale" in stale.stderr


def test_what_init_new_build_and_stub_write_passes_ruff_at_its_default_line_length(
    tmp_path: Path,
) -> None:
    """The README's project flow, then ruff with its defaults (line length 88) and its
    line-length rule: `new`'s description (73 characters) made a 91-column line in SPEC, which
    fits a line of its own but was left where it was."""
    # A longer name too: the stub's docstrings that name it made 90 and 94 columns.
    steps = (["init", "--package", "flow_pkg"], ["new", "crm.find-order.v1"])
    steps += (["new", "crm.find-customer-orders.v1"], ["build"])
    stubs = (["stub", "crm.find-order.v1"], ["stub", "crm.find-customer-orders.v1"])
    for step in (*steps, *stubs):
        done = run_cli(*step, cwd=tmp_path)
        assert done.returncode == 0, (step, done.stderr)
    written = [tmp_path / "generated", tmp_path / "quickstart.py"]
    written += [tmp_path / "find_order_v1.py", tmp_path / "find_customer_orders_v1.py"]
    for rules in ((), ("--extend-select", "E501,W")):
        linted = subprocess.run(
            [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", *rules]
            + [str(path) for path in written],
            capture_output=True,
            text=True,
            check=False,
        )
        assert linted.returncode == 0, linted.stdout
    module = import_generated(tmp_path / "generated", "flow_pkg.crm.find_order_v1")
    skeleton = json.loads((tmp_path / "specs" / "crm" / "find-order.v1.json").read_text())
    assert module.SPEC.description == skeleton["description"]
