"""JSON Schema patterns (ECMA-262) checked at build and carried into models only where they mean
the same.

The runtime validates with jsonschema-rs, whose ECMA reading is the truth: a pattern it cannot
compile is a spec problem. Models check patterns with pydantic's engine: the Rust ``regex`` crate
(linear time) by default, Python's ``re`` in a model whose configuration says
``regex_engine="python-re"`` (datamodel-code-generator writes it where it needs a lookahead of its
own), and a type alias has no configuration of its own: the model that uses it decides. Neither
engine falls back to the other, so a pattern one of them refuses makes the module fail at import.

So a pattern reaches a model translated where the readings differ (``\\d``, ``\\w``, ``\\s`` are
ASCII/ECMA sets at run time, Unicode in both engines; nested classes and set operators in
``regex``), written in escapes both engines read (``\\xHH``, ``\\uHHHH``, ``\\UHHHHHHHH``), and
only when both engines compile it; not at all where one of them cannot hold it with the same
meaning (lookaround and backreferences, ``\\p{...}``, ECMA's ASCII ``\\b``): that field's model is
then looser, and the JSON Schema still enforces it.
"""

from __future__ import annotations

import re
import warnings
from functools import cache

import jsonschema_rs


def escaped(code_point: int) -> str:
    """A code point as an escape both engines read the same way."""
    if code_point <= 0xFF:
        return f"\\x{code_point:02X}"
    if code_point <= 0xFFFF:
        return f"\\u{code_point:04X}"
    return f"\\U{code_point:08X}"


# ECMA-262's WhiteSpace and LineTerminator code points: its \s.
_SPACE = "\\t\\n\\x0B\\x0C\\r \\xA0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000\\uFEFF"
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


# A code point in braces: ECMA's \u{...} (and the \x{...} the runtime's engine also reads).
_BRACED = re.compile(r"[ux]\{([0-9A-Fa-f]{1,8})\}")


def _translate(pattern: str) -> str | None:
    out: list[str] = []
    i, in_class, n = 0, False, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                return None
            e = pattern[i + 1]
            braced = _BRACED.match(pattern, i + 1)
            if e in _CLASSES:
                members, negated = _CLASSES[e]
                if in_class and negated:
                    return None  # [\D]: a set inside a set, which Python's re cannot write
                out.append(members if in_class else f"[{'^' if negated else ''}{members}]")
            elif e == "c" and i + 2 < n and pattern[i + 2].isascii() and pattern[i + 2].isalpha():
                out.append(escaped(ord(pattern[i + 2]) % 32))
                i += 1
            elif braced is not None:
                code_point = int(braced.group(1), 16)
                if code_point > 0x10FFFF:
                    return None
                out.append(escaped(code_point))
                i = braced.end()
                continue
            elif in_class and e == "b":
                out.append(escaped(8))  # [\b]: the backspace
            elif e.isdigit() or e in "kpPbB":
                # Backreferences (none in the regex crate); Unicode properties (none in Python's
                # re); \b and \B, ASCII word boundaries in ECMA and Unicode ones in both engines.
                return None
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
    """Whether both of pydantic's engines compile ``pattern`` (Python's without a warning: its
    FutureWarning marks a class it reads otherwise than a later Python will)."""
    from pydantic_core import SchemaValidator, core_schema

    for engine in ("rust-regex", "python-re"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                SchemaValidator(core_schema.str_schema(pattern=pattern, regex_engine=engine))
        except Exception:  # SchemaError, or a FutureWarning raised: the engine refuses it
            return False
    return True
