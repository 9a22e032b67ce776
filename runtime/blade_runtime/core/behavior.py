"""Narrowed behaviour: what one call of a tool does, decided from its validated input.

A spec declares a tool's most conservative kind and side effect. A registration's ``behavior``
callback may narrow them for one call (seed 000's ``resolveBehavior``): ``delete_file`` with
``dry_run: true`` is ``read_only`` and ``pure``. Never wider than the spec: a call whose
callback answers wider is refused (POLICY_FAILED, the reason in the log). The narrowed
behaviour is what the permission policy sees (``PermissionRequest.kind`` and ``.side_effect``)
and what the call's start stores, so recovery follows it: a call narrowed to ``idempotent`` is
run again after a crash, one left ``non_idempotent`` settles as INTERRUPTED.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from blade_runtime.core.spec import SideEffect, ToolKind, ToolSpec

SIDE_EFFECTS: tuple[SideEffect, ...] = ("pure", "idempotent", "non_idempotent")
"""Narrowest first: a call may be declared any side effect up to its spec's."""
KINDS: tuple[ToolKind, ...] = ("read_only", "write", "execute")
"""Narrowest first: a call may be declared any kind up to its spec's (any, if it has none)."""


@dataclass(frozen=True, slots=True)
class Behavior:
    """One call's kind and side effect; None keeps the spec's."""

    kind: ToolKind | None = None
    side_effect: SideEffect | None = None


BehaviorCallback = Callable[[Any], Behavior]
"""The typed input in, the call's behaviour out (called once, before the permission policy)."""


class BehaviorRejected(ValueError):
    """A ``behavior`` callback answered wider than the spec declares, or not a ``Behavior``."""


def narrowed(spec: ToolSpec[Any, Any, Any], name: str, answer: object) -> Behavior:
    """``answer`` checked against ``spec`` and completed with the spec's values."""
    if not isinstance(answer, Behavior):
        raise BehaviorRejected(
            f"the behavior callback of {name!r} returned {answer!r}; return a Behavior"
        )
    kind = spec.kind if answer.kind is None else answer.kind
    side_effect = spec.side_effect if answer.side_effect is None else answer.side_effect
    if side_effect not in SIDE_EFFECTS or SIDE_EFFECTS.index(side_effect) > SIDE_EFFECTS.index(
        spec.side_effect
    ):
        raise BehaviorRejected(
            f"the behavior callback of {name!r} answered side effect {side_effect!r}, wider "
            f"than its spec {spec.id}'s {spec.side_effect!r}; a call may only narrow it (one of "
            f"{', '.join(SIDE_EFFECTS[: SIDE_EFFECTS.index(spec.side_effect) + 1])})"
        )
    if kind is not None and (
        kind not in KINDS or (spec.kind is not None and KINDS.index(kind) > KINDS.index(spec.kind))
    ):
        allowed = KINDS if spec.kind is None else KINDS[: KINDS.index(spec.kind) + 1]
        raise BehaviorRejected(
            f"the behavior callback of {name!r} answered kind {kind!r}, wider than its spec "
            f"{spec.id}'s {spec.kind!r}; a call may only narrow it (one of {', '.join(allowed)})"
        )
    return Behavior(kind, side_effect)
