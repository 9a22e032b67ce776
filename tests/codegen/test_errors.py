"""Spec errors point at the offending key, suggest the nearest known name, and read as words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blade_codegen.explain import JSON_TYPES, nearest
from blade_codegen.load import load
from blade_codegen.validate import meta_schema, validate

SPEC_TEXT = """{
  "id": "t.x.v1",
  "name": "x",
  "descripton": "What it does.",
  "kind": "readonly",
  "inputSchema": {
    "type": "object",
    "properties": {
      "a": {"type": "strng"},
      "b": {"type": ["integer", "nul"]},
      "c": {"minLength": "3"}
    }
  },
  "suspend": {"p": {"suspendSchem": {}, "resumeSchema": {}}}
}
"""


@pytest.fixture
def problems(tmp_path: Path) -> list[str]:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "x.v1.json").write_text(SPEC_TEXT, "utf-8")
    return [str(p) for p in validate(load(tmp_path))]


def test_a_misspelled_key_is_reported_at_the_key_with_the_nearest_name(
    problems: list[str],
) -> None:
    assert (
        't/x.v1.json:4:3: /descripton: unknown key "descripton" (did you mean "description"?)'
        in (problems)
    )
    nested = 't/x.v1.json:14:21: /suspend/p/suspendSchem: unknown key "suspendSchem"'
    assert any(p.startswith(nested + ' (did you mean "suspendSchema"?)') for p in problems)
    # The missing key its misspelling stands for is not reported a second time.
    assert not any('"description" is missing' in p for p in problems)


def test_a_misspelled_enum_value_and_type_name_get_suggestions(problems: list[str]) -> None:
    assert any(p.startswith('t/x.v1.json:5:3: /kind: "readonly"') for p in problems)
    assert any('did you mean "read_only"?' in p for p in problems)
    assert any(
        p.startswith('t/x.v1.json:9:13: /inputSchema/properties/a/type: "strng" is not a JSON')
        and 'did you mean "string"?' in p
        for p in problems
    )
    assert any('"nul" in the type list' in p and 'did you mean "null"?' in p for p in problems)


def test_meta_schema_failures_read_as_plain_words(problems: list[str]) -> None:
    assert (
        "t/x.v1.json:11:13: /inputSchema/properties/c/minLength: minLength must be a whole "
        'number, not "3"' in problems
    )
    assert not any("anyOf" in p or "is not valid under any" in p for p in problems)
    assert all(":1:1:" not in p for p in problems)


SPEC_KEYS = sorted(meta_schema()["properties"])


@settings(max_examples=200, deadline=None)
@given(
    word=st.sampled_from([*SPEC_KEYS, *JSON_TYPES]),
    data=st.data(),
)
def test_one_typo_is_traced_back_to_its_word(word: str, data: st.DataObject) -> None:
    if len(word) < 4:
        return
    index = data.draw(st.integers(0, len(word) - 1))
    edit = data.draw(st.sampled_from(["drop", "double", "swap"]))
    if edit == "drop":
        typo = word[:index] + word[index + 1 :]
    elif edit == "double":
        typo = word[:index] + word[index] + word[index:]
    else:
        if index == len(word) - 1:
            return
        typo = word[:index] + word[index + 1] + word[index] + word[index + 2 :]
    if typo == word:
        return
    options = SPEC_KEYS if word in SPEC_KEYS else list(JSON_TYPES)
    assert nearest(typo, options) == word


def test_problems_are_one_line_each_in_the_documented_form(problems: list[str]) -> None:
    for problem in problems:
        assert "\n" not in problem
        path, line, column, rest = problem.split(":", 3)
        assert path == "t/x.v1.json" and int(line) > 1 and int(column) >= 1
        assert rest.startswith(" /")
    json.dumps(problems)
