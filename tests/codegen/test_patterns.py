"""Patterns are ECMA-262: checked at build, carried into models only with the same meaning."""

from __future__ import annotations

from pathlib import Path

import jsonschema_rs
import pytest
from conftest import add_spec, import_generated, spec
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_core import SchemaValidator, core_schema

from blade_codegen.build import build
from blade_codegen.patterns import ecma_problem, model_pattern
from blade_codegen.problems import SpecError

# Pieces whose ECMA and regex-crate readings differ, or that the crate cannot read at all.
PIECES = [
    "\\d",
    "\\D",
    "\\w",
    "\\W",
    "\\s",
    "\\S",
    ".",
    "\\b",
    "a",
    "é",
    "-",
    "[a-z]",
    "[^\\s]",
    "[\\w.-]",
    "[\\D]",
    "\\p{L}",
    "\\p{Lu}",
    "(?:ab|c)",
    "(?<n>x)",
    "\\cJ",
    "\\u00e9",
    "\\/",
    "[[]",
    "[&]",
    "[~]",
    "(?=a)",
    "(?!b)",
    "\\x41",
    "+",
    "*",
    "?",
    "{2}",
    "{1,3}",
    "^",
    "$",
]
ALPHABET = "aAbé0٣_ -\t\n\r\x0b\ufeff\x85\u2028\u3000&~[/J\x0aA"


def _runtime(pattern: str, text: str) -> bool:
    return bool(jsonschema_rs.Draft202012Validator({"pattern": pattern}).is_valid(text))


def _model(pattern: str, text: str) -> bool:
    """Whether a model accepts ``text``, whichever engine its configuration picks."""
    for engine in ("rust-regex", "python-re"):
        validator = SchemaValidator(core_schema.str_schema(pattern=pattern, regex_engine=engine))
        try:
            validator.validate_python(text)
        except Exception:
            return False
    return True


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(st.sampled_from(PIECES), min_size=1, max_size=5),
    texts=st.lists(st.text(ALPHABET, max_size=4), min_size=1, max_size=8),
)
def test_a_translated_pattern_accepts_every_string_the_runtime_accepts(
    pieces: list[str], texts: list[str]
) -> None:
    pattern = "".join(pieces)
    if ecma_problem(pattern) is not None:
        return
    translated = model_pattern(pattern)
    if translated is None:
        return  # left out of the model: nothing can be refused
    for text in texts:
        if _runtime(pattern, text):
            assert _model(translated, text), (pattern, translated, text)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("^\\d+$", "^[0-9]+$"),
        ("^\\p{L}+$", None),  # Python's re has no Unicode properties
        ("(?<year>\\d{4})", "(?P<year>[0-9]{4})"),
        (
            "^\\s$",
            "^[\\t\\n\\x0B\\x0C\\r \\xA0\\u1680\\u2000-\\u200A"
            "\\u2028\\u2029\\u202F\\u205F\\u3000\\uFEFF]$",
        ),
        ("\\u{1F600}\\x{41}\\cJ", "\\U0001F600\\x41\\x0A"),
        ("[\\b]", "[\\x08]"),  # in a class, the backspace
        ("a\\b", None),  # ECMA's \b is ASCII, both engines' Unicode
        ("[a\\S]", None),  # a set in a set: Python's re cannot write it
        ("(?=a)\\p{L}", None),  # lookaround: neither engine pydantic offers holds it
        ("(a)\\1", None),
    ],
)
def test_translation(pattern: str, expected: str | None) -> None:
    assert model_pattern(pattern) == expected


@pytest.mark.parametrize("pattern", ["(", "a{", "[z-a]", "a**"])
def test_an_invalid_pattern_is_a_spec_problem_with_its_pointer(
    tmp_path: Path, pattern: str
) -> None:
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": pattern}}}
    add_spec(tmp_path / "specs", spec("t.bad-pattern.v1", inputSchema=schema))
    with pytest.raises(SpecError) as raised:
        build(tmp_path / "specs", tmp_path / "out", "pkg")
    [problem] = raised.value.problems
    assert problem.pointer == "/inputSchema/properties/code/pattern"
    assert problem.line > 1
    assert "not a valid ECMA-262 regular expression" in problem.message
    assert not (tmp_path / "out").exists()


def test_an_invalid_pattern_property_name_is_a_spec_problem(tmp_path: Path) -> None:
    schema = {"type": "object", "patternProperties": {"(x": {"type": "string"}}}
    add_spec(tmp_path / "specs", spec("t.bad-names.v1", outputSchema=schema))
    with pytest.raises(SpecError) as raised:
        build(tmp_path / "specs", tmp_path / "out", "pkg")
    assert [p.pointer for p in raised.value.problems] == ["/outputSchema/patternProperties/(x"]


def test_no_pattern_makes_a_module_fail_at_import(tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "properties": {
            "word": {"type": "string", "pattern": "^(?=[A-Z])\\p{L}+$"},
            "digits": {"type": "string", "pattern": "^\\d+$"},
            "letters": {"type": "string", "pattern": "^\\p{L}+$"},
        },
    }
    add_spec(tmp_path / "specs", spec("t.patterns.v1", inputSchema=schema))
    build(tmp_path / "specs", tmp_path / "out", "pattern_pkg")
    text = (tmp_path / "out" / "pattern_pkg" / "t" / "patterns_v1.py").read_text("utf-8")
    assert "/properties/word: a 'pattern' the models' regex engine cannot hold" in text
    module = import_generated(tmp_path / "out", "pattern_pkg.t.patterns_v1")
    value = module.PatternsInput.model_validate({"word": "Élan", "digits": "42", "letters": "é"})
    assert value.model_dump(exclude_unset=True) == {"word": "Élan", "digits": "42", "letters": "é"}
    with pytest.raises(ValueError):
        module.PatternsInput(digits="٣")  # the runtime's \d is ASCII: so is the model's


# Escapes as a spec's JSON holds them once parsed: \xHH, \uHHHH, \u{...}, control and identity
# escapes, beside characters a Python string literal must escape (quotes, backslashes, line
# breaks, NUL, U+2028) and ones it need not.
ESCAPES = [
    "\\x41",
    "\\x7f",
    "\\xff",
    "\\x00",
    "\\x{41}",
    "\\u0041",
    "\\u{1F600}",
    "\\uD83D\\uDE00",
    "\\cJ",
    "\\t",
    "\\n",
    "\\f",
    "\\v",
    "\\/",
    "\\-",
    "\\\\",
    '\\"',
    '"',
    "'",
    '"""',
    "\n",
    "\x00",
    "\u2028",
    "é",
    "[\\x41-\\x5A]",
    "\\d",
    "a",
    "{2}",
    "^",
    "$",
]


@settings(max_examples=4, deadline=None)
@given(patterns=st.lists(st.lists(st.sampled_from(ESCAPES), min_size=1, max_size=5), min_size=8))
def test_patterns_with_escapes_build_modules_that_import_and_keep_each_pattern(
    tmp_path_factory: pytest.TempPathFactory, patterns: list[list[str]]
) -> None:
    """Every pattern the runtime compiles builds into a module that imports, its model's field
    holding the translated pattern exactly (a literal's escaping lost nothing): the issue's
    ^\\x41+$ among them."""
    kept = [
        "^\\x41+$",
        *dict.fromkeys("".join(p) for p in patterns if ecma_problem("".join(p)) is None),
    ]
    properties = {f"p{i}": {"type": "string", "pattern": p} for i, p in enumerate(kept)}
    schema = {"type": "object", "properties": properties}
    root = tmp_path_factory.mktemp("escapes")
    add_spec(root / "specs", spec("t.escapes.v1", inputSchema=schema))
    package = f"escapes_{root.name.replace('-', '_')}"
    build(root / "specs", root / "out", package)
    module = import_generated(root / "out", f"{package}.t.escapes_v1")
    fields = module.EscapesInput.model_fields
    for i, pattern in enumerate(kept):
        found = [m.pattern for m in fields[f"p{i}"].metadata if getattr(m, "pattern", None)]
        assert found == ([] if model_pattern(pattern) is None else [model_pattern(pattern)])
    assert module.EscapesInput.model_validate({"p0": "AAA"}).p0 == "AAA"
    with pytest.raises(ValueError):
        module.EscapesInput.model_validate({"p0": "B"})


@pytest.mark.parametrize("pattern", ["\\x4", "\\xZZ", "a\\x", "[\\x4]"])
def test_an_incomplete_hex_escape_is_refused_at_build(tmp_path: Path, pattern: str) -> None:
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": pattern}}}
    add_spec(tmp_path / "specs", spec("t.hex.v1", inputSchema=schema))
    with pytest.raises(SpecError) as raised:
        build(tmp_path / "specs", tmp_path / "out", "pkg")
    [problem] = raised.value.problems
    assert problem.pointer == "/inputSchema/properties/code/pattern"
    assert "incomplete escape" in problem.message
    assert not (tmp_path / "out").exists()
