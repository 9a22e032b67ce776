"""The syntax tree of generated code, parsed once for the rewrites that read it in turn.

Each rewrite of the generated models (models.py, cheaper.py) and the split of a module (render.py)
takes code as text and returns text. Most of them change nothing in most modules, so the next one
would parse the very same text again: on a large schema set parsing was a fifth of the build.
The trees are shared, so no caller may change one.
"""

from __future__ import annotations

import ast
from functools import lru_cache


@lru_cache(maxsize=2)
def parsed(code: str) -> ast.Module:
    """``ast.parse(code)``, the same tree while ``code`` is the text last parsed (do not modify
    it)."""
    return ast.parse(code)
