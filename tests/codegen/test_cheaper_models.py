"""The cheaper shapes of generated models accept exactly what the shapes they replace accepted.

Constrained scalar items are plain values (a type alias, not a root model per item); numeric
bounds on ``float | int`` sit on each member (unless a
multipleOf is there); ``validate_by_name`` stays only where a field has an
alias. Each rewrite is checked against the JSON Schema it came from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from conftest import add_spec, import_generated, run_mypy, spec
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from blade_codegen.cheaper import bounds_per_member, by_name_only_with_aliases

ITEMS = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,4}$"}},
        "minutes": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "prices": {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0}},
        "lat": {"type": "number", "minimum": -90.5, "maximum": 90},
        "first-name": {"type": "string"},
    },
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from blade_codegen.build import build

    root = tmp_path_factory.mktemp("cheaper")
    plain = {**ITEMS, "properties": {k: v for k, v in ITEMS["properties"].items() if "-" not in k}}
    add_spec(root / "specs", spec("t.items.v1", inputSchema=ITEMS, outputSchema=plain))
    build(root / "specs", root / "out", "cheaper_pkg")
    return root / "out"


def _module(out: Path) -> Any:
    return import_generated(out, "cheaper_pkg.t.items_v1")


def test_constrained_scalar_items_are_plain_values(built: Path) -> None:
    module = _module(built)
    typed = module.ItemsInput.model_validate({"tags": ["ab"], "minutes": [3], "prices": [0.5]})
    assert typed.tags == ["ab"] and type(typed.tags[0]) is str
    assert typed.minutes == [3] and type(typed.minutes[0]) is int
    for refused in ({"tags": ["AB"]}, {"minutes": [-1]}, {"prices": [0]}):
        with pytest.raises(ValidationError):
            module.ItemsInput.model_validate(refused)
    source = (built / "cheaper_pkg" / "t" / "items_v1.py").read_text()
    assert "RootModel" not in source and "ItemsInputTag: TypeAlias = Annotated[str" in source


def test_mypy_takes_plain_items_and_refuses_wrong_ones(built: Path) -> None:
    ok = built / "ok.py"
    ok.write_text(
        "from cheaper_pkg.t.items_v1 import ItemsInput\nfrom pydantic import MISSING\n"
        "x = ItemsInput(tags=['ab'], minutes=[1], prices=[2.5], first_name='Ann')\n"
        "tags: list[str] | MISSING = x.tags\n"
    )
    bad = built / "bad.py"
    bad.write_text("from cheaper_pkg.t.items_v1 import ItemsInput\nItemsInput(minutes=['1'])\n")
    assert run_mypy(ok, cwd=built).returncode == 0
    refused = run_mypy(bad, cwd=built)
    assert refused.returncode == 1 and "list-item" in refused.stdout


def test_validate_by_name_stays_only_where_a_field_has_an_alias(built: Path) -> None:
    module = _module(built)
    assert module.ItemsInput.model_config.get("validate_by_name") is True
    assert module.ItemsInput(first_name="Ann").first_name == "Ann"
    assert "validate_by_name" not in module.ItemsOutput.model_config
    code = "class A(BaseModel):\n    model_config = ConfigDict(validate_by_name=True)\n    a: int\n"
    assert by_name_only_with_aliases(code) == code.replace("validate_by_name=True", "")


_BOUND = st.one_of(
    st.integers(-1000, 1000),
    st.floats(-1000, 1000, allow_nan=False).map(lambda v: round(v, 2)),
)
_NUMBER = st.one_of(
    st.integers(-1100, 1100),
    st.floats(-1100, 1100, allow_nan=False),
    st.integers(-5, 5).map(float),
)
_KEYWORDS = {"gt": "exclusiveMinimum", "ge": "minimum", "lt": "exclusiveMaximum", "le": "maximum"}


def _model(code: str) -> type[BaseModel]:
    namespace: dict[str, Any] = {}
    header = "from typing import Annotated\nfrom pydantic import BaseModel, Field\n"
    # dont_inherit: this module's `from __future__ import annotations` would leave the
    # annotations as strings that pydantic cannot resolve in a bare namespace.
    exec(compile(header + code, "<model>", "exec", dont_inherit=True), namespace)
    model: type[BaseModel] = namespace["M"]
    return model


@settings(max_examples=150, deadline=None)
@given(
    bounds=st.dictionaries(st.sampled_from(sorted(_KEYWORDS)), _BOUND, min_size=1, max_size=2),
    multiple=st.one_of(st.none(), st.sampled_from([1, 2, 3.0, 0.5, 2.5])),
    values=st.lists(_NUMBER, min_size=1, max_size=8),
)
def test_bounds_per_member_accept_what_the_schema_accepts(
    bounds: dict[str, float | int], multiple: float | None, values: list[float | int]
) -> None:
    keywords = dict(bounds)
    if multiple is not None:
        keywords["multiple_of"] = multiple
    field = ", ".join(f"{k}={v!r}" for k, v in keywords.items())
    code = bounds_per_member(
        f"class M(BaseModel):\n    v: Annotated[float | int, Field({field})]\n"
    )
    schema: dict[str, Any] = {"type": "number"}
    schema.update({_KEYWORDS[k]: v for k, v in bounds.items()})
    if multiple is not None:
        schema["multipleOf"] = multiple
    # Split unless a multipleOf is there (pydantic-core's float check has a tolerance).
    assert ("Annotated[int, Field(" in code) == (multiple is None)
    original = _model(f"class M(BaseModel):\n    v: Annotated[float | int, Field({field})]\n")
    model, validator = _model(code), jsonschema_rs.validator_for(schema)
    for value in values:
        before = _accepted(original, value)
        after = _accepted(model, value)
        assert after == before, (code, value)
        if multiple is None:  # the schema's own verdict (multipleOf of floats: validators differ)
            assert (after is not None) == validator.is_valid(value), (code, value)
        if after is not None:
            assert type(after) is type(value) and after == value  # an int stays an int


def _accepted(model: type[BaseModel], value: float | int) -> float | int | None:
    try:
        kept: float | int = model.model_validate({"v": value}).v
    except ValidationError:
        return None
    return kept
