"""The OpenAPI document as the field's tools read it (issue 50.6): it validates as OpenAPI 3.1
(openapi-spec-validator), and openapi-python-client, the usual Python generator, makes a client
from it that calls a tool and answers its pending action against a served runtime."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from http_support import ALICE, REFUND, authenticate, runtime_of, serving
from openapi_spec_validator import OpenAPIV31SpecValidator

from blade_runtime.serving.http import create_app


def every_bundled_spec() -> tuple[Any, Any]:
    """A runtime of the four tools of the bundled specs/, and their counting implementations."""
    from blade_specs.deploy import deploy_service_v1 as deploy

    runtime, tools = runtime_of()

    async def deploys(ctx: Any) -> Any:
        return deploy.DeployServiceOutput(deployed=True, steps=1)

    runtime.register(deploy.SPEC, deploys)
    return runtime, tools


def test_the_document_of_the_bundled_specs_is_valid_openapi_3_1(example_package: Any) -> None:
    runtime, _ = every_bundled_spec()
    app = create_app(runtime, authenticate=authenticate)
    with serving(app) as server, httpx.Client(base_url=server.url) as http:
        document = http.get("/v1/openapi.json", headers=ALICE).json()
    errors = [
        f"{'/'.join(map(str, error.path))}: {error.message}"
        for error in OpenAPIV31SpecValidator(document).iter_errors()
    ]
    assert errors == []
    assert {p.split("/")[3] for p in document["paths"] if p.startswith("/v1/tools/")} == {
        "lookup_customer",
        "refund_payment",
        "check_page",
        "deploy_service",
    }


def test_openapi_python_client_generates_a_client_that_calls_and_answers(
    tmp_path: Path, example_package: Any
) -> None:
    runtime, tools = every_bundled_spec()
    app = create_app(runtime, authenticate=authenticate)
    with serving(app) as server:
        document = httpx.get(f"{server.url}/v1/openapi.json", headers=ALICE).json()
        (tmp_path / "openapi.json").write_text(json.dumps(document))
        bin_dir = Path(sys.executable).parent
        generated = subprocess.run(
            [
                str(bin_dir / "openapi-python-client"),
                "generate",
                "--path",
                "openapi.json",
                "--output-path",
                "client",
            ],
            cwd=tmp_path,
            env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert generated.returncode == 0, generated.stdout + generated.stderr
        assert "Warning" not in generated.stdout, generated.stdout
        sys.path.insert(0, str(tmp_path / "client"))
        try:
            package = "blade_runtime_client"
            client_module = importlib.import_module(package)
            call_lookup = importlib.import_module(f"{package}.api.default.call_lookup_customer")
            call_refund = importlib.import_module(f"{package}.api.default.call_refund_payment")
            submit = importlib.import_module(
                f"{package}.api.default.submit_refund_payment_approval"
            )
            models = importlib.import_module(f"{package}.models")
            client = client_module.AuthenticatedClient(base_url=server.url, token="token-alice")
            with client:
                found = call_lookup.sync_detailed(
                    client=client, body=models.LookupCustomerInput(customer_id="cus_1")
                )
                assert found.status_code == 200, found.content
                assert found.parsed.output.found is False
                waiting = call_refund.sync_detailed(
                    client=client, body=models.RefundPaymentInput.from_dict(REFUND)
                )
                assert waiting.status_code == 202, waiting.content
                assert isinstance(waiting.parsed, models.Pending)
                action = waiting.parsed.action
                assert action.tool == "refund_payment" and action.point == "approval"
                done = submit.sync_detailed(
                    action_id=action.action_id,
                    client=client,
                    body=models.RefundPaymentApprovalSubmit(approved=True, approver="ann"),
                )
                assert done.status_code == 200, done.content
                assert isinstance(done.parsed, models.Result)
                assert done.parsed.output == {"status": "refunded", "refund_id": "re_1"}
        finally:
            sys.path.remove(str(tmp_path / "client"))
            for name in [m for m in sys.modules if m.split(".")[0] == "blade_runtime_client"]:
                del sys.modules[name]
    assert tools.lookups == 1 and tools.refund_entries == 2  # the call, then its resume
