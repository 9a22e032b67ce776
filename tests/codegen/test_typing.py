"""mypy holds implementations to their generated interfaces."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import run_mypy

CORRECT = """
from blade_runtime import ResumeEntry
from blade_specs.deploy.deploy_service_v1 import (
    DeployServiceExecution, DeployServiceImplementation, DeployServiceLogData,
    DeployServiceOutput, DeployServiceProgressData,
)
from blade_specs.payments.refund_payment_v1 import (
    RefundPaymentApprovalSuspend, RefundPaymentExecution, RefundPaymentImplementation,
    RefundPaymentOutput, RefundPaymentOutputRefunded as Refunded,
    RefundPaymentOutputDeclined as Declined,
)
from blade_specs.crm.lookup_customer_v1 import (
    LookupCustomerExecution, LookupCustomerImplementation, LookupCustomerOutput,
)


async def deploy(ctx: DeployServiceExecution) -> DeployServiceOutput:
    record = DeployServiceProgressData(step="build", status="running")
    await ctx.data.write("progress", record, id="b")
    await ctx.data.write("log", DeployServiceLogData(line="building"), transient=True)
    items = await ctx.data.list("progress")
    step: str = items[0].value.step
    if ctx.signal.cancelled:
        ctx.fail(f"cancelled at {step}")
    return DeployServiceOutput(deployed=True, steps=len(items), url=None)


async def refund(ctx: RefundPaymentExecution) -> RefundPaymentOutput:
    entry = ctx.entry
    if isinstance(entry, ResumeEntry):
        if entry.payload.approved:
            return Refunded(status="refunded", refund_id=ctx.context.operator_id)
        return Declined(status="declined", by=entry.payload.approver)
    ctx.suspend("approval", RefundPaymentApprovalSuspend(prompt="ok?", amount=ctx.input.amount))


async def lookup(ctx: LookupCustomerExecution) -> LookupCustomerOutput:
    tenant: str = ctx.context.tenant_id
    return LookupCustomerOutput(found=bool(tenant and ctx.input.customer_id))


a: DeployServiceImplementation = deploy
b: RefundPaymentImplementation = refund
c: LookupCustomerImplementation = lookup
"""

WRONG_OUTPUT = """
from blade_specs.crm.lookup_customer_v1 import LookupCustomerExecution, LookupCustomerImplementation
from blade_specs.deploy.deploy_service_v1 import DeployServiceOutput


async def lookup(ctx: LookupCustomerExecution) -> DeployServiceOutput:
    return DeployServiceOutput(deployed=True, steps=1)


c: LookupCustomerImplementation = lookup
"""

UNKNOWN_CHANNEL = """
from blade_specs.deploy.deploy_service_v1 import (
    DeployServiceExecution, DeployServiceOutput, DeployServiceProgressData,
)


async def deploy(ctx: DeployServiceExecution) -> DeployServiceOutput:
    await ctx.data.write("progres", DeployServiceProgressData(step="build", status="running"))
    return DeployServiceOutput(deployed=True, steps=1)
"""

UNDECLARED_POINT = """
from blade_specs.payments.refund_payment_v1 import (
    RefundPaymentApprovalSuspend, RefundPaymentExecution, RefundPaymentOutput,
)


async def refund(ctx: RefundPaymentExecution) -> RefundPaymentOutput:
    ctx.suspend("review", RefundPaymentApprovalSuspend(prompt="ok?", amount=ctx.input.amount))
"""

WRONG_RECORD = """
from blade_specs.deploy.deploy_service_v1 import (
    DeployServiceExecution, DeployServiceLogData, DeployServiceOutput,
)


async def deploy(ctx: DeployServiceExecution) -> DeployServiceOutput:
    await ctx.data.write("progress", DeployServiceLogData(line="wrong record type"))
    return DeployServiceOutput(deployed=True, steps=1)
"""

NO_SUSPEND_POINTS = """
from blade_specs.crm.lookup_customer_v1 import LookupCustomerExecution, LookupCustomerOutput


async def lookup(ctx: LookupCustomerExecution) -> LookupCustomerOutput:
    ctx.suspend("approval", None)
"""


REGISTERED = """
from blade_runtime import CallInfo, Runtime
from blade_specs.crm import lookup_customer_v1 as lookup
from blade_specs.deploy import deploy_service_v1 as deploy


async def deploy_impl(ctx: deploy.DeployServiceExecution) -> deploy.DeployServiceOutput:
    return deploy.DeployServiceOutput(deployed=True, steps=1)


async def lookup_impl(ctx: lookup.LookupCustomerExecution) -> lookup.LookupCustomerOutput:
    return lookup.LookupCustomerOutput(found=False)


async def tenant(call: CallInfo) -> lookup.LookupCustomerContext:
    return lookup.LookupCustomerContext(tenant_id=call.run_id)


runtime = Runtime()
runtime.register(deploy.SPEC, deploy_impl)
runtime.register(lookup.SPEC, lookup_impl, context=tenant)
runtime.register(
    lookup.SPEC,
    lookup_impl,
    name="sync",
    context=lambda call: lookup.LookupCustomerContext(tenant_id="t"),
)
"""

REGISTERED_WRONG_OUTPUT = """
from blade_runtime import Runtime
from blade_specs.crm import lookup_customer_v1 as lookup
from blade_specs.deploy import deploy_service_v1 as deploy


async def impl(ctx: lookup.LookupCustomerExecution) -> deploy.DeployServiceOutput:
    return deploy.DeployServiceOutput(deployed=True, steps=1)


Runtime().register(
    lookup.SPEC, impl, context=lambda call: lookup.LookupCustomerContext(tenant_id="t")
)
"""

REGISTERED_WRONG_TOOL = """
from blade_runtime import Runtime
from blade_specs.crm import lookup_customer_v1 as lookup
from blade_specs.deploy import deploy_service_v1 as deploy


async def impl(ctx: lookup.LookupCustomerExecution) -> deploy.DeployServiceOutput:
    return deploy.DeployServiceOutput(deployed=True, steps=1)


Runtime().register(deploy.SPEC, impl)
"""

REGISTERED_WRONG_CONTEXT = """
from blade_runtime import Runtime
from blade_specs.crm import lookup_customer_v1 as lookup


async def impl(ctx: lookup.LookupCustomerExecution) -> lookup.LookupCustomerOutput:
    return lookup.LookupCustomerOutput(found=False)


Runtime().register(lookup.SPEC, impl, context=lambda call: "tenant-1")
"""


def test_correct_implementation_type_checks_and_wrong_ones_are_rejected(
    built_examples: Path,
) -> None:
    cases = {
        "correct": CORRECT,
        "wrong_output": WRONG_OUTPUT,
        "unknown_channel": UNKNOWN_CHANNEL,
        "undeclared_point": UNDECLARED_POINT,
        "wrong_record": WRONG_RECORD,
        "no_suspend_points": NO_SUSPEND_POINTS,
        "registered": REGISTERED,
        "registered_wrong_output": REGISTERED_WRONG_OUTPUT,
        "registered_wrong_tool": REGISTERED_WRONG_TOOL,
        "registered_wrong_context": REGISTERED_WRONG_CONTEXT,
    }
    for name, code in cases.items():
        (built_examples / f"impl_{name}.py").write_text(code, "utf-8")
    result = run_mypy(*(built_examples / f"impl_{n}.py" for n in cases), cwd=built_examples)
    errors: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        match = re.match(r"impl_(\w+)\.py:\d+: error: (.*)", line)
        if match:
            errors.setdefault(match.group(1), []).append(match.group(2))
    assert "correct" not in errors, errors.get("correct")
    assert any("Incompatible types in assignment" in e for e in errors["wrong_output"])
    assert any("No overload variant" in e for e in errors["unknown_channel"])
    assert any("Literal['review']" in e for e in errors["undeclared_point"])
    assert any("No overload variant" in e for e in errors["wrong_record"])
    assert any('has no attribute "suspend"' in e for e in errors["no_suspend_points"])
    assert "registered" not in errors, errors.get("registered")
    for wrong in ("registered_wrong_output", "registered_wrong_tool", "registered_wrong_context"):
        assert any("Argument" in e and "register" in e for e in errors[wrong]), errors.get(wrong)


def test_the_runtime_page_implementation_example_type_checks(built_examples: Path) -> None:
    from conftest import ROOT

    readme = (ROOT / "docs" / "runtime.md").read_text("utf-8")
    example = readme.split("An implementation:\n\n```python\n", 1)[1].split("```", 1)[0]
    path = built_examples / "readme_example.py"
    path.write_text(example, "utf-8")
    result = run_mypy(path, cwd=built_examples)
    assert result.returncode == 0, result.stdout


def test_the_runtime_page_running_example_type_checks_and_runs(built_examples: Path) -> None:
    from conftest import ROOT

    readme = (ROOT / "docs" / "runtime.md").read_text("utf-8")
    example = readme.split("Running it:\n\n```python\n", 1)[1].split("```", 1)[0]
    path = built_examples / "readme_runtime.py"
    path.write_text(example, "utf-8")
    result = run_mypy(path, cwd=built_examples)
    assert result.returncode == 0, result.stdout
    ran = subprocess.run(
        [sys.executable, str(path)], cwd=built_examples, capture_output=True, text=True, check=False
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "{'deployed': True, 'steps': 1}\n"
