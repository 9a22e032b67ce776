"""The typed client DTOs generated into every package, and the client over a Runtime."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, add_spec, run_mypy, run_ruff, spec, write_json

from blade_codegen.build import build
from blade_codegen.problems import SpecError
from blade_runtime import Runtime
from blade_runtime.client import CallError, CallPending

CONSUMER = (ROOT / "tests" / "fixtures" / "consumer.py").read_text("utf-8")


def consumer(package: str, folder: Path, name: str = "consumer.py", text: str = CONSUMER) -> Path:
    path = folder / name
    path.write_text(text.replace("PACKAGE", package), "utf-8")
    return path


def test_consumer_of_the_typed_client_type_checks_and_runs(
    built_examples: Path, tmp_path: Path
) -> None:
    script = consumer("blade_specs", tmp_path)
    checked = run_mypy(script, cwd=built_examples)
    assert checked.returncode == 0, checked.stdout
    env = {**os.environ, "PYTHONPATH": str(built_examples)}
    ran = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, check=False
    )
    assert ran.returncode == 0 and "consumer ok" in ran.stdout, ran.stderr


def test_mypy_rejects_a_forgotten_action_and_a_wrong_payload(
    built_examples: Path, tmp_path: Path
) -> None:
    case = '        case CheckPageAction():\n            return f"open {action.input.url}"\n'
    assert case in CONSUMER
    forgot = consumer("blade_specs", tmp_path, "forgot.py", CONSUMER.replace(case, ""))
    wrong = consumer(
        "blade_specs",
        tmp_path,
        "wrong.py",
        CONSUMER.replace(
            'refund.RefundPaymentApprovalResume(approved=True, approver="ann")',
            'refund.RefundPaymentApprovalSuspend(prompt="x", amount=money)',
        ),
    )
    assert wrong.read_text() != CONSUMER.replace("PACKAGE", "blade_specs")
    checked = run_mypy(forgot, wrong, cwd=built_examples)
    errors = sorted(line for line in checked.stdout.splitlines() if ": error:" in line)
    assert len(errors) == 2, checked.stdout
    assert "forgot.py" in errors[0]
    assert '"assert_never" has incompatible type "CheckPageAction"' in errors[0]
    assert "wrong.py" in errors[1] and 'expected "RefundPaymentApprovalResume"' in errors[1]


def test_client_errors_are_values_and_actions_stay_pending(example_package: Any) -> None:
    from blade_specs.client import Client
    from blade_specs.payments import refund_payment_v1 as refund
    from blade_specs.shared.common.money import Money

    async def suspend(ctx: Any) -> Any:
        ctx.suspend("approval", refund.RefundPaymentApprovalSuspend(prompt="?", amount=money))

    money = Money(amount_minor=1, currency="USD")
    arguments = refund.RefundPaymentInput(payment_id="p", amount=money, reason="r")

    async def scenario() -> None:
        runtime = Runtime()
        client = Client(runtime)
        missing = await client.refund_payment(arguments, call_id="c0")
        assert isinstance(missing, CallError) and missing.code == "TOOL_HANDLER_NOT_FOUND"
        runtime.register(
            refund.SPEC, suspend, name="refund", context=lambda call: {"operator_id": "o"}
        )
        first = await client.refund_payment(arguments, call_id="c1")
        assert isinstance(first, CallPending)
        # The result DTO is the wire form: its JSON parses back into the same typed value.
        assert refund.RESULT.parse(first.model_dump(mode="json")) == first
        # A payload the resume schema rejects is refused, and the action stays pending.
        bad = refund.RefundPaymentApprovalResume.model_construct(approved="yes", approver="a")
        refused = await first.action.submit(bad)
        assert isinstance(refused, CallError) and refused.code == "INVALID_SUBMISSION"
        assert [a.action_id for a in client.pending()] == [first.action.action_id]
        cancelled = await first.action.cancel("not needed")
        assert cancelled.code == "CANCELLED" and client.pending() == []
        # An action parsed from JSON alone is not bound to any client.
        detached = refund.RefundPaymentApprovalAction.model_validate(first.action.model_dump())
        with pytest.raises(RuntimeError, match="not bound to a client"):
            await detached.cancel()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (("lookup.customer", "lookup_customer"), "method lookup_customer would also be"),
        (("pending",), "method pending would also be that of a method of every client"),
        (("read_file",), "method read_file would also be that of a method of every client"),
        (("suspensions",), "method suspensions would also be"),
    ],
)
def test_client_method_collisions_are_refused(
    tmp_path: Path, names: tuple[str, ...], message: str
) -> None:
    for i, name in enumerate(names):
        add_spec(tmp_path / "specs", spec(f"ns.tool-{i}.v1", name=name))
    with pytest.raises(SpecError) as refused:
        build(tmp_path / "specs", tmp_path / "out", "pkg")
    assert message in str(refused.value)


def test_every_name_the_client_already_has_is_refused_to_a_tool() -> None:
    """A tool's method named like one the package's client inherits or is given by the
    template would override it with another signature (and fail mypy): each is taken."""
    import re

    from blade_codegen.plan import CLIENT_METHODS
    from blade_runtime.client import ToolClient

    inherited = {name for name in dir(ToolClient) if not name.startswith("_")}
    template = (ROOT / "templates" / "package_client.py.jinja").read_text("utf-8")
    written = set(re.findall(r"^    (?:async )?def ([a-z]\w*)\(", template, re.MULTILINE))
    assert inherited | written == CLIENT_METHODS


def test_the_pending_actions_page_client_example_type_checks(built_examples: Path) -> None:
    readme = (ROOT / "docs" / "pending-actions-and-stores.md").read_text("utf-8")
    marker = "mypy checks a `match` for exhaustiveness:\n\n```python\n"
    example = readme.split(marker, 1)[1].split("```", 1)[0]
    path = built_examples / "readme_client.py"
    path.write_text(example, "utf-8")
    result = run_mypy(path, cwd=built_examples)
    assert result.returncode == 0, result.stdout


def test_a_spec_cannot_take_the_client_module(tmp_path: Path) -> None:
    write_json(tmp_path / "specs" / "client.json", {**spec("a.b.v1"), "id": "client"})
    with pytest.raises(SpecError) as refused:
        build(tmp_path / "specs", tmp_path / "out", "pkg")
    # An id is namespace.tool-name.vN, so no spec's module is ever the package's client.py;
    # this one is refused for its missing version before it could take it, and nothing is built.
    assert "/id: id 'client' has no version" in str(refused.value)
    assert not (tmp_path / "out" / "pkg").exists()


def test_client_of_many_tools_in_one_folder_passes_ruff_and_mypy(tmp_path: Path) -> None:
    pair = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    for index in range(3):
        suspend = {"wait": {"suspendSchema": pair, "resumeSchema": pair}}
        add_spec(tmp_path / "specs", spec(f"ns.tool-{index}.v1", suspend=suspend))
    build(tmp_path / "specs", tmp_path / "out", "many")
    client = (tmp_path / "out" / "many" / "client.py").read_text("utf-8")
    assert client.count("from .ns import tool_") == 3
    ruff = run_ruff(tmp_path / "out" / "many")
    assert ruff.returncode == 0, ruff.stdout
    checked = run_mypy(tmp_path / "out" / "many", cwd=tmp_path / "out")
    assert checked.returncode == 0, checked.stdout


def test_an_in_process_client_for_a_principal_sees_and_answers_only_its_own(
    example_package: Any,
) -> None:
    """``RuntimeTransport(runtime, principal)``: its calls are the principal's, and it lists,
    reads and answers only the actions and data the store's records show the principal."""
    from blade_specs.browser.check_page_v1 import SPEC, CheckPageInput, CheckPageOutput
    from blade_specs.client import Client

    from blade_runtime import Principal
    from blade_runtime.client import RuntimeTransport

    runtime = Runtime()
    runtime.register_client(SPEC)
    ann = Client(RuntimeTransport(runtime, Principal("ann", "acme")))
    bob = Client(RuntimeTransport(runtime, Principal("bob", "globex")))

    async def main() -> None:
        waiting = await ann.check_page(CheckPageInput(url="https://a.example"), run_id="r")
        assert isinstance(waiting, CallPending)
        assert [a.action_id for a in ann.pending(run_id="r")] == [waiting.action.action_id]
        assert bob.pending(run_id="r") == []
        stolen = bob.action(waiting.action.model_dump(mode="json"))
        refused = await stolen.submit(CheckPageOutput(status_code=200))
        assert isinstance(refused, CallError) and refused.code == "UNKNOWN_ACTION"
        assert len(Client(runtime).pending(run_id="r")) == 1  # the application sees all
        done = await waiting.action.submit(CheckPageOutput(status_code=200))
        assert done.status == "success"

    asyncio.run(main())
