"""Spec packages: pack as wheels, install without the toolchain, depend on them."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import EXAMPLE_SPECS, ROOT, add_spec, spec, write_json
from packaging.requirements import Requirement

from blade_codegen.build import build
from blade_codegen.cli import main
from blade_codegen.pack import _build
from blade_codegen.problems import SpecError

CONSUMER = (ROOT / "tests" / "fixtures" / "consumer.py").read_text("utf-8")
MONEY_REF = "blade:blade-tool-examples/common/money.schema.json#/$defs/Money"


def order_spec(**overrides: object) -> dict[str, object]:
    """A tool of a second spec package whose input uses the first package's Money."""
    defaults: dict[str, object] = {
        "name": "create_order",
        "inputSchema": {
            "type": "object",
            "properties": {"sku": {"type": "string"}, "price": {"$ref": MONEY_REF}},
            "required": ["sku", "price"],
            "additionalProperties": False,
        },
        "outputSchema": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        "children": ["crm.lookup-customer.v1"],
    }
    return spec("orders.create-order.v1", **{**defaults, **overrides})


ORDERS_CONSUMER = """
import asyncio

from blade_runtime import Runtime
from blade_runtime.client import CallSuccess
from blade_tool_examples.crm import lookup_customer_v1 as lookup
from blade_tool_examples.shared.common.money import Money
from blade_tool_orders.client import Client
from blade_tool_orders.orders import create_order_v1 as orders


async def lookup_customer(ctx: lookup.LookupCustomerExecution) -> lookup.LookupCustomerOutput:
    return lookup.LookupCustomerOutput(found=ctx.input.customer_id == "cus_1")


async def create_order(ctx: orders.CreateOrderExecution) -> orders.CreateOrderOutput:
    known = await ctx.tools.call(lookup.SPEC, lookup.LookupCustomerInput(customer_id="cus_1"))
    if not known.found:
        ctx.fail("unknown customer")
    return orders.CreateOrderOutput(order_id=f"ord-{ctx.input.price.amount_minor}")


async def main() -> None:
    runtime = Runtime()
    context = lookup.LookupCustomerContext(tenant_id="t")
    runtime.register(lookup.SPEC, lookup_customer, context=lambda call: context)
    runtime.register(orders.SPEC, create_order)
    price: Money = Money(amount_minor=990, currency="EUR")
    result = await Client(runtime).create_order(orders.CreateOrderInput(sku="s", price=price))
    assert isinstance(result, CallSuccess), result
    assert result.output.order_id == "ord-990"


asyncio.run(main())
print("orders ok")
"""


@dataclass(frozen=True)
class Packages:
    root: Path
    first_wheel: Path
    first_lock: Path
    second_wheel: Path
    python: Path  # a fresh virtual environment with the two wheels and the runtime only


def pack_cli(specs: Path, name: str, version: str, out: Path) -> Result:
    """``blade-codegen pack`` through click's runner."""
    arguments = ["pack", str(specs), "--name", name, "--version", version, "--out", str(out)]
    return CliRunner().invoke(main, arguments)


def _pip(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
        check=True,
        capture_output=True,
    )


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> Packages:
    """The example specs packed as blade-tool-examples 1.0.0; a second package that references
    its Money, packed by the CLI against the first installed (PYTHONPATH); both installed into a
    fresh virtual environment, with the runtime and nothing of the toolchain."""
    root = tmp_path_factory.mktemp("pack")
    shutil.copytree(EXAMPLE_SPECS, root / "first" / "specs")
    packed = pack_cli(root / "first" / "specs", "blade-tool-examples", "1.0.0", root / "dist")
    assert packed.exit_code == 0, packed.output
    first_wheel = root / "dist" / "blade_tool_examples-1.0.0-py3-none-any.whl"

    _pip("install", "--no-deps", "--target", str(root / "site"), str(first_wheel))
    add_spec(root / "second" / "specs", order_spec())
    env = {**os.environ, "PYTHONPATH": str(root / "site")}
    second = subprocess.run(
        [
            sys.executable,
            "-m",
            "blade_codegen",
            "pack",
            str(root / "second" / "specs"),
            "--name",
            "blade-tool-orders",
            "--version",
            "0.1.0",
            "--out",
            str(root / "dist"),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert second.returncode == 0, second.stderr

    runtime_wheel = _build(ROOT / "runtime", "wheel", root / "wheels")
    venv.create(root / "fresh", with_pip=False)
    python = root / "fresh" / "bin" / "python"
    second_wheel = root / "dist" / "blade_tool_orders-0.1.0-py3-none-any.whl"
    _pip(
        "--python", str(python), "install", str(runtime_wheel), str(first_wheel), str(second_wheel)
    )
    return Packages(root, first_wheel, root / "first" / "blade.lock.json", second_wheel, python)


def _isolated() -> dict[str, str]:
    """This process's environment without PYTHONPATH: the fresh environment sees only what is
    installed in it."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}


def _run(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), *args], capture_output=True, text=True, check=False, cwd="/", env=_isolated()
    )


def _mypy(python: Path, *scripts: Path) -> subprocess.CompletedProcess[str]:
    """The toolchain's mypy, resolving imports in the fresh environment only."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--python-executable",
            str(python),
            *map(str, scripts),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=scripts[0].parent,
        env=_isolated(),
    )


def test_wheel_holds_the_package_and_depends_on_runtime_and_pydantic_only(
    packages: Packages,
) -> None:
    with zipfile.ZipFile(packages.first_wheel) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read("blade_tool_examples-1.0.0.dist-info/METADATA").decode()
    for member in (
        "py.typed",
        "manifest.json",
        "blade.lock.json",
        "client.py",
        "payments/refund_payment_v1.py",
        "shared/common/money.py",
        "specs/payments/refund-payment.v1.json",
        "specs/common/money.schema.json",
    ):
        assert f"blade_tool_examples/{member}" in names
    assert not any(".blade-build" in name for name in names)
    requires = sorted(line for line in metadata.splitlines() if line.startswith("Requires-Dist"))
    assert [Requirement(r.split(": ")[1]).name for r in requires] == ["blade-runtime", "pydantic"]
    # The README lists every tool with its facts and an example.
    for spec_id in ("browser.check-page.v1", "payments.refund-payment.v1"):
        assert f"### `{spec_id}`" in metadata
    assert "| suspend points | `approval` |" in metadata
    assert "| data channels | `progress`, `log` |" in metadata
    assert "await client.refund_payment(arguments)" in metadata
    # The release is recorded in the project's lock, which the wheel ships too.
    lock = json.loads(packages.first_lock.read_text("utf-8"))
    assert set(lock["specs"]) == {
        "browser.check-page.v1",
        "crm.lookup-customer.v1",
        "deploy.deploy-service.v1",
        "payments.refund-payment.v1",
    }


def test_fresh_environment_imports_the_package_without_the_toolchain(
    packages: Packages, tmp_path: Path
) -> None:
    probe = _run(
        packages.python,
        "-c",
        "import importlib.util as u, blade_tool_examples as p;"
        "print(len(p.load_all()), [u.find_spec(m) is None for m in"
        " ('blade_codegen', 'datamodel_code_generator', 'jinja2', 'black')])",
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "4 [True, True, True, True]"

    script = tmp_path / "consumer.py"
    script.write_text(CONSUMER.replace("PACKAGE", "blade_tool_examples"), "utf-8")
    case = '        case CheckPageAction():\n            return f"open {action.input.url}"\n'
    forgot = tmp_path / "forgot.py"
    forgot.write_text(script.read_text("utf-8").replace(case, ""), "utf-8")
    checked = _mypy(packages.python, script)
    assert checked.returncode == 0, checked.stdout
    rejected = _mypy(packages.python, forgot)
    assert rejected.returncode == 1
    assert '"assert_never" has incompatible type "CheckPageAction"' in rejected.stdout
    ran = _run(packages.python, str(script))
    assert ran.returncode == 0 and "consumer ok" in ran.stdout, ran.stderr


def test_second_package_imports_the_first_packages_class(
    packages: Packages, tmp_path: Path
) -> None:
    with zipfile.ZipFile(packages.second_wheel) as wheel:
        module = wheel.read("blade_tool_orders/orders/create_order_v1.py").decode()
        metadata = wheel.read("blade_tool_orders-0.1.0.dist-info/METADATA").decode()
        names = wheel.namelist()
    assert "from blade_tool_examples.shared.common.money import Money" in module
    assert "from blade_tool_examples.crm import lookup_customer_v1 as child_" in module
    assert "class Money" not in module
    assert not any(name.startswith("blade_tool_orders/shared/") for name in names)
    assert "Requires-Dist: blade-tool-examples>=1.0.0" in metadata

    script = tmp_path / "orders.py"
    script.write_text(ORDERS_CONSUMER, "utf-8")
    checked = _mypy(packages.python, script)
    assert checked.returncode == 0, checked.stdout
    ran = _run(packages.python, str(script))
    assert ran.returncode == 0 and "orders ok" in ran.stdout, ran.stderr


@pytest.fixture
def installed_first(packages: Packages, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the installed first package, importable in this process."""
    site = tmp_path / "site"
    shutil.copytree(packages.root / "site", site)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    return site


def test_dependency_errors_name_the_reference_and_the_installed_version(
    installed_first: Path, tmp_path: Path
) -> None:
    specs = tmp_path / "specs"
    add_spec(specs, order_spec())
    add_spec(specs, spec("crm.lookup-customer.v1", name="lookup_again"))
    (installed_first / "blade_tool_examples" / "specs" / "common" / "money.schema.json").unlink()
    with pytest.raises(SpecError) as refused:
        build(specs, tmp_path / "out", "orders")
    lines = str(refused.value).splitlines()
    assert any(
        "/inputSchema/properties/price/$ref" in line
        and "blade-tool-examples 1.0.0 ships no common/money.schema.json" in line
        for line in lines
    ), lines
    assert any(
        "crm/lookup-customer.v1.json" in line
        and "id 'crm.lookup-customer.v1' is also a tool of blade-tool-examples 1.0.0" in line
        for line in lines
    ), lines
    assert not (tmp_path / "out").exists()


def test_a_missing_definition_and_a_missing_package_are_clear(
    installed_first: Path, tmp_path: Path
) -> None:
    specs = tmp_path / "specs"
    ref = "blade:blade-tool-examples/common/money.schema.json#/$defs/Price"
    add_spec(specs, order_spec(inputSchema={"type": "object", "properties": {"p": {"$ref": ref}}}))
    other = "blade:blade-tool-absent/x.schema.json"
    add_spec(
        specs, spec("x.y.v1", inputSchema={"type": "object", "properties": {"q": {"$ref": other}}})
    )
    with pytest.raises(SpecError) as refused:
        build(specs, tmp_path / "out", "orders")
    text = str(refused.value)
    assert (
        "/$defs/Price does not exist in common/money.schema.json of blade-tool-examples 1.0.0"
        in text
    )
    assert "the spec package blade-tool-absent is not installed" in text
    assert "pip install blade-tool-absent" in text


@pytest.mark.parametrize(
    "name",
    [
        "blade-tools-crm",
        "blade-tool-CRM",
        "blade-tool-crm_x",
        "crm",
        "blade-tool-",
        "blade-tool-utils",
    ],
)
def test_names_outside_the_convention_are_refused_with_the_rule(name: str, tmp_path: Path) -> None:
    result = pack_cli(EXAMPLE_SPECS, name, "1.0.0", tmp_path)
    assert result.exit_code == 2
    assert "blade-tool-<capability or target system>" in result.output
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []


def test_pack_refuses_a_breaking_change_and_keeps_the_lock(
    packages: Packages, tmp_path: Path
) -> None:
    specs = tmp_path / "specs"
    shutil.copytree(packages.root / "first" / "specs", specs)
    lock = tmp_path / "blade.lock.json"
    shutil.copyfile(packages.first_lock, lock)
    path = specs / "deploy" / "deploy-service.v1.json"
    data = json.loads(path.read_text("utf-8"))
    data["inputSchema"]["properties"]["environment"]["enum"] = ["staging"]
    write_json(path, data)
    result = pack_cli(specs, "blade-tool-examples", "1.1.0", tmp_path / "dist")
    assert result.exit_code == 5, result.output
    assert "ENUM_VALUE_REMOVED" in result.output and "nothing was packed" in result.output
    assert not (tmp_path / "dist").exists()
    assert lock.read_bytes() == packages.first_lock.read_bytes()


def test_packing_the_same_specs_twice_gives_the_same_wheel(
    packages: Packages, tmp_path: Path
) -> None:
    specs = tmp_path / "specs"
    shutil.copytree(packages.root / "first" / "specs", specs)
    shutil.copyfile(packages.first_lock, tmp_path / "blade.lock.json")
    result = pack_cli(specs, "blade-tool-examples", "1.0.0", tmp_path / "dist")
    assert result.exit_code == 0, result.output
    assert "release already in" in result.output
    again = tmp_path / "dist" / packages.first_wheel.name
    assert again.read_bytes() == packages.first_wheel.read_bytes()


def test_a_child_from_an_installed_package_needs_no_reference(
    installed_first: Path, tmp_path: Path
) -> None:
    specs = tmp_path / "specs"
    add_spec(specs, spec("audit.review.v1", children=["crm.lookup-customer.v1"]))
    build(specs, tmp_path / "out", "audit")
    module = (tmp_path / "out" / "audit" / "audit" / "review_v1.py").read_text("utf-8")
    assert "from blade_tool_examples.crm import lookup_customer_v1 as child_" in module
    assert "input: child_lookup_customer_v1.LookupCustomerInput" in module


def test_a_rebuild_notices_an_upgraded_spec_package(installed_first: Path, tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    add_spec(specs, spec("audit.review.v1", children=["crm.lookup-customer.v1"]))
    assert build(specs, tmp_path / "out", "audit").status == "written"
    assert build(specs, tmp_path / "out", "audit").status == "unchanged"
    metadata = installed_first / "blade_tool_examples-1.0.0.dist-info" / "METADATA"
    metadata.write_text(metadata.read_text("utf-8").replace("Version: 1.0.0", "Version: 1.0.1"))
    assert build(specs, tmp_path / "out", "audit").status == "written"
    assert build(specs, tmp_path / "out", "audit").status == "unchanged"


def test_a_child_two_installed_packages_hold_is_refused_not_picked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blade_codegen import dependencies

    tools = {"crm.lookup-customer.v1": {"id": "crm.lookup-customer.v1"}}
    twins = [
        dependencies.Dependency(name, "1.0.0", name.replace("-", "_"), tmp_path / name, tools)
        for name in ("blade-tool-crm", "blade-tool-examples")
    ]
    monkeypatch.setattr(dependencies, "installed_spec_packages", lambda: twins)
    specs = tmp_path / "specs"
    add_spec(specs, spec("audit.review.v1", children=["crm.lookup-customer.v1"]))
    with pytest.raises(SpecError) as refused:
        build(specs, tmp_path / "out", "audit")
    assert "audit/review.v1.json:" in str(refused.value)
    assert (
        "/children/0: child 'crm.lookup-customer.v1' is a tool of each of blade-tool-crm 1.0.0, "
        "blade-tool-examples 1.0.0"
    ) in str(refused.value)
    assert not (tmp_path / "out").exists()
