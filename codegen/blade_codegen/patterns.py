"""JSON Schema patterns (ECMA-262) checked at build and carried into models only where they mean
the same.

The runtime validates with jsonschema-rs, whose ECMA reading is the truth: a pattern it cannot
compile is a spec problem. Models check patterns with pydantic's engine (the Rust ``regex`` crate,
linear time; pydantic does not fall back to Python's ``re`` when a pattern fails there, the module
fails at import). So a pattern reaches a model translated where the two readings differ (``\\d``,
``\\w``, ``\\s`` are ASCII/ECMA sets at run time, Unicode in ``regex``; nested classes and set
operators in ``regex``), and not at all where ``regex`` cannot hold it (lookaround,
backreferences): that field's model is then looser, and the JSON Schema still enforces it.
"""

from __future__ import annotations

import re
import warnings
from functools import cache

import jsonschema_rs

# ECMA-262's WhiteSpace and LineTerminator code points: its \s.
_SPACE = "\\t\\n\\x0B\\x0C\\r \\xA0\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
_SPACE += "\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}"
# Class escapes as (members for use inside a class, negated).
_CLASSES = {
    "d": ("0-9", False),
    "D": ("0-9", True),
    "w": ("0-9A-Za-z_", False),
    "W": ("0-9A-Za-z_", True),
    "s": (_SPACE, False),
    "S": (_SPACE, True),
}
# Characters the regex crate reads as set operators or nested classes inside a class.
_CLASS_SPECIAL = "[&~"


@cache
def ecma_problem(pattern: str) -> str | None:
    """Why the runtime's validator refuses ``pattern``, or None when it compiles."""
    try:
        jsonschema_rs.Draft202012Validator({"pattern": pattern})
    except (jsonschema_rs.ValidationError, ValueError):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # FutureWarning on nested sets
                re.compile(pattern)
        except re.error as error:
            return f"{error.msg} at position {error.pos}"
        return "the runtime's ECMA-262 engine cannot compile it"
    return None


@cache
def model_pattern(pattern: str) -> str | None:
    """``pattern`` in the dialect of pydantic's engine, same meaning; None when it cannot be."""
    translated = _translate(pattern)
    if translated is None or not _compiles(translated):
        return None
    return translated


def _translate(pattern: str) -> str | None:
    out: list[str] = []
    i, in_class, n = 0, False, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                return None
            e = pattern[i + 1]
            if e in _CLASSES:
                members, negated = _CLASSES[e]
                if in_class and not negated:
                    out.append(members)
                else:
                    out.append(f"[{'^' if negated else ''}{members}]")
            elif e == "c" and i + 2 < n and pattern[i + 2].isascii() and pattern[i + 2].isalpha():
                out.append(f"\\x{{{ord(pattern[i + 2]) % 32:X}}}")
                i += 1
            elif e.isdigit() or e == "k":
                return None  # a backreference: the regex crate has none
            else:
                out.append(c + e)
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
            elif c in _CLASS_SPECIAL:
                c = "\\" + c
            out.append(c)
        elif c == "[":
            rest = pattern[i + 1 : i + 3]
            if rest.startswith("]") or rest == "^]":
                return None  # [] and [^]: ECMA's empty and full sets
            in_class = True
            out.append(c)
            if rest.startswith("^"):
                out.append("^")
                i += 1
        elif c == "(" and pattern.startswith("(?", i):
            if pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
                return None  # lookaround
            if pattern.startswith("(?<", i):
                out.append("(?P<")
                i += 3
                continue
            out.append(c)
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _compiles(pattern: str) -> bool:
    from pydantic_core import SchemaValidator, core_schema

    try:
        SchemaValidator(core_schema.str_schema(pattern=pattern, regex_engine="rust-regex"))
    except Exception:  # pydantic-core raises SchemaError for patterns its engine refuses
        return False
    return True
