"""The spec package README names each tool's permissions, capabilities and environment
variables beside its side effects (seed 000's package convention)."""

from __future__ import annotations

from pathlib import Path

from conftest import add_spec, spec

from blade_codegen.pack import readme
from blade_codegen.plan import plan
from blade_codegen.resolve import resolve_specs


def _readme(root: Path) -> str:
    return readme(plan(resolve_specs(root), "ops_pkg", ""), "blade-tool-ops", [])


def test_each_tool_s_permissions_capabilities_and_environment_are_beside_its_side_effect(
    tmp_path: Path,
) -> None:
    add_spec(
        tmp_path,
        spec(
            "ops.deploy-app.v1",
            kind="execute",
            sideEffect="idempotent",
            lease=True,
            permissions={"production": {"description": "Deploy to | production"}},
            capabilities={"http": {"description": "Calls the\n deploy API"}, "db": {}},
            environment={
                "DEPLOY_TOKEN": {"description": "The deploy API's token"},
                "DEPLOY_REGION": {"description": "Region", "required": False},
            },
        ),
    )
    add_spec(tmp_path, spec("ops.plain.v1"))
    text = _readme(tmp_path)
    deploy, plain = text.split("### `ops.deploy-app.v1`")[1].split("### `ops.plain.v1`")
    rows = [line for line in deploy.splitlines() if line.startswith("| ")]
    assert rows[4:8] == [
        "| side effect | idempotent; lease fencing (`ctx.lease`) |",
        "| permissions | `production`: Deploy to \\| production |",  # one cell, however written
        "| capabilities | `db`; `http`: Calls the deploy API |",
        "| environment variables | `DEPLOY_REGION` (optional): Region; "
        "`DEPLOY_TOKEN` (required): The deploy API's token |",
    ]
    assert "| side effect | non_idempotent |" in plain
    assert "| permissions | none declared |" in plain
    assert "| capabilities | none |" in plain
    assert "| environment variables | none |" in plain
    assert _readme(tmp_path) == text  # deterministic
