"""Permissions that can ask: allow, deny, or ask a human through a durable permission request.

A policy decides per call on the final input (after pre-hooks and validation), seeing the tool's
kind, side effect and spec id, the caller's principal and a cancellation signal. ``Ask`` makes a
**permission request**: a pending action of its own kind (its point is ``@permission``), listed,
submitted and cancelled like the others, in process, on the CLI and in the typed client. Its
answer is ``{"decision": "approve"}``, ``{"decision": "deny", "message": "..."}`` or
``{"decision": "approve", "input": {...}}`` (edited input, validated against the tool's input
schema before anything runs). The decision is stored (with the edited input) before the
implementation runs, and recovery honours it.

``await ctx.request_permission(prompt, subject=...)`` asks in the middle of a tool's work. The
policy decides first (``PermissionRequest.step`` is True, with the prompt and subject): an allow
returns at once, a denial ends the call as PERMISSION_DENIED; when it asks, a standing grant of
the principal for the tool and subject allows (``core.grants``), and otherwise the call waits on
a durable request (point ``@permission-step``, no edited input) and is entered again, where the
same ``request_permission`` returns the person's ``PermissionAnswer``. With no policy, a person
is asked. An answer with ``"always": true`` makes a standing grant.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, JsonValue

from blade_runtime.core.caller import Principal
from blade_runtime.core.context import CallInfo, CancellationSignal
from blade_runtime.core.registry import Point, typed
from blade_runtime.core.spec import JsonObject, ToolSpec

ADMISSION = "@permission"
"""The point of a permission request made before a call runs (the policy said ``Ask``)."""
STEP = "@permission-step"
"""The point of a permission request made by ``ctx.request_permission`` inside a tool."""
POINTS = frozenset({ADMISSION, STEP})

DEFAULT_DENIAL = "A person declined this tool call."


@dataclass(frozen=True, slots=True)
class Allow:
    """Run the call."""


@dataclass(frozen=True, slots=True)
class Deny:
    """Refuse the call: it settles as PERMISSION_DENIED with ``message`` for the model."""

    message: str = "The tool call was not permitted."


@dataclass(frozen=True, slots=True)
class Ask:
    """Ask a human: the call waits on a durable permission request showing ``prompt``."""

    prompt: str | None = None


Decision: TypeAlias = Allow | Deny | Ask
ALLOW = Allow()
ASK = Ask()


@dataclass(slots=True)
class PermissionRequest:
    """What a policy decides on: the input that will execute, after hooks and validation.
    (Not frozen: one is built for every call a policy decides, on the call's hot path.)"""

    name: str
    spec: ToolSpec[Any, Any, Any]
    call: CallInfo
    input: JsonObject
    _scope: Any = None  # the call's cancel scope: its signal is made when first asked for
    step: bool = False  # asked by ctx.request_permission inside the tool, not before it ran
    prompt: str | None = None  # the step's prompt
    subject: str | None = None  # what the step acts on (standing grants are per subject)
    source: str = "spec"  # the registration's source: spec, dynamic, mcp:<server>
    trust: str = "workspace"  # and trust level: trusted, workspace, remote

    @property
    def spec_id(self) -> str:
        spec_id: str = self.spec.id  # the spec's generic id type, a str
        return spec_id

    @property
    def kind(self) -> str | None:
        """The call's kind: the spec's, or what its registration narrowed it to."""
        behavior = self.call.behavior
        return self.spec.kind if behavior is None else behavior.kind

    @property
    def side_effect(self) -> str:
        """The call's side effect: the spec's, or what its registration narrowed it to."""
        behavior = self.call.behavior
        if behavior is None or behavior.side_effect is None:
            return self.spec.side_effect
        return behavior.side_effect

    @property
    def principal(self) -> Principal | None:
        context = self.call.context
        return None if context is None else context.principal

    @property
    def signal(self) -> CancellationSignal:
        """Set when the call is cancelled: a policy that waits (on a person) should stop."""
        if self._scope is None:
            self._scope = _Unbound()
        signal: CancellationSignal = self._scope.signal
        return signal


class _Unbound:
    """A request made outside a call's scope (tests, tools): a signal that is never set."""

    def __init__(self) -> None:
        self.signal = CancellationSignal()


PolicyAnswer: TypeAlias = Decision | str | None
"""``None``, ``Allow()`` or ``"allow"`` allows; ``Ask()`` or ``"ask"`` asks; ``Deny(sentence)``,
``"deny"`` or any other sentence denies (the sentence is what the model reads)."""
Policy: TypeAlias = Callable[[PermissionRequest], PolicyAnswer | Awaitable[PolicyAnswer]]


DECISIONS = (Allow, Deny, Ask)
_WORDS: dict[str, Decision] = {"allow": ALLOW, "deny": Deny(), "ask": ASK}
_LABELS = {Allow: "allow", Deny: "deny", Ask: "ask"}


def describe_decision(decision: Decision) -> tuple[str, str | None]:
    """(allow | deny | ask, the denial's sentence or the request's prompt)."""
    if isinstance(decision, Deny):
        return "deny", decision.message
    if isinstance(decision, Ask):
        return "ask", decision.prompt
    return _LABELS[type(decision)], None


def decision_of(answer: PolicyAnswer) -> Decision:
    if answer is None:
        return ALLOW
    if type(answer) in DECISIONS:
        return answer  # type: ignore[return-value]  # narrowed by the line above
    if isinstance(answer, str):
        # A decision's own word is that decision ("allow" allows), never a denial reading
        # "allow"; any other sentence denies, and is what the model reads.
        word = _WORDS.get(answer.strip().lower())
        return Deny(answer) if word is None else word
    if isinstance(answer, Allow | Deny | Ask):
        return answer
    raise TypeError(f"a permission policy returned {answer!r}; return Allow(), Deny() or Ask()")


def by_kind(
    *,
    ask: Collection[str] = ("write", "execute"),
    deny: Collection[str] = (),
    allow: Collection[str] = (),
    unknown: Decision = ALLOW,
) -> Policy:
    """A policy by the tool's kind: ``Ask`` for the kinds in ``ask`` and ``Deny`` for those in
    ``deny``, unless the registration name is in ``allow``; tools of no kind get ``unknown``.

    ``Runtime(permission=by_kind())`` asks for every ``write`` and ``execute`` tool."""
    asking, denying, allowed = frozenset(ask), frozenset(deny), frozenset(allow)

    def policy(request: PermissionRequest) -> Decision:
        if request.name in allowed:
            return ALLOW
        if request.kind is None:
            return unknown
        if request.kind in denying:
            return Deny(f"Tools of kind {request.kind} are not permitted here.")
        if request.kind in asking:
            return Ask()
        return ALLOW

    return policy


async def decide(policy: Policy, request: PermissionRequest) -> Decision:
    answer = policy(request)
    if inspect.isawaitable(answer):
        answer = await answer
    return decision_of(answer)


class PermissionPrompt(BaseModel):
    """What a permission request shows (its payload, typed)."""

    model_config = ConfigDict(frozen=True)
    tool: str
    spec_id: str | None = None
    kind: str | None = None
    side_effect: str | None = None
    prompt: str
    input: dict[str, JsonValue] = {}
    details: JsonValue = None
    subject: str | None = None


class PermissionAnswer(BaseModel):
    """A human's answer to a permission request."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    decision: Literal["approve", "deny"]
    message: str | None = None
    input: dict[str, JsonValue] | None = None
    always: bool = False  # approve, and do not ask again (a standing grant)

    @property
    def approved(self) -> bool:
        return self.decision == "approve"


def answer_schema(input_schema: JsonObject | None) -> JsonObject:
    """The schema a permission request's answer is validated against (stored with the action,
    so the CLI validates it too): with ``input_schema``, an edited input must satisfy it."""
    properties: dict[str, Any] = {
        "decision": {"enum": ["approve", "deny"]},
        "message": {"type": "string", "minLength": 1},
        "always": {
            "type": "boolean",
            "title": "Always allow",
            "description": "Approve, and do not ask this person again for this tool and subject.",
        },
    }
    schema: dict[str, Any] = {
        "type": "object",
        "required": ["decision"],
        "additionalProperties": False,
        "properties": properties,
    }
    if input_schema is not None:
        properties["input"] = {"$ref": "#/$defs/input"}
        schema["$defs"] = {"input": _nested(input_schema, "#/$defs/input")}
    return schema


PROMPT_SCHEMA: JsonObject = {
    "type": "object",
    "required": ["tool", "prompt"],
    "properties": {
        "tool": {"type": "string"},
        "spec_id": {"type": ["string", "null"]},
        "kind": {"type": ["string", "null"]},
        "side_effect": {"type": ["string", "null"]},
        "prompt": {"type": "string"},
        "input": {"type": "object"},
        "subject": {"type": ["string", "null"]},
    },
}

STEP_POINT = Point(
    STEP, typed(PROMPT_SCHEMA, PermissionPrompt), typed(answer_schema(None), PermissionAnswer)
)
"""The point ``ctx.request_permission`` waits at, in every backend tool."""


def step_payload(
    call: CallInfo, prompt: str, details: JsonValue, subject: str | None = None
) -> JsonValue:
    payload: dict[str, JsonValue] = {
        "tool": call.name,
        "spec_id": call.spec_id,
        "prompt": prompt,
        "details": details,
    }
    if subject is not None:
        payload["subject"] = subject
    return payload


class StepRefused(BaseException):
    """``ctx.request_permission`` was refused without asking a person: the call ends with
    ``code`` (PERMISSION_DENIED, or POLICY_FAILED when the policy raised). A BaseException, so
    that an implementation's ``except Exception`` does not go on to the step it guards."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


APPROVED = PermissionAnswer(decision="approve")
"""What ``request_permission`` returns when the policy or a standing grant allows the step."""


def request_payload(
    request: PermissionRequest, prompt: str | None, details: JsonValue = None
) -> JsonValue:
    """What a permission request shows: the tool, its contract and the input that would run."""
    return {
        "tool": request.name,
        "spec_id": request.spec_id,
        "kind": request.kind,
        "side_effect": request.side_effect,
        # the spec's own: what an input a person edits runs as where nothing narrows it again
        "spec_kind": request.spec.kind,
        "spec_side_effect": request.spec.side_effect,
        "prompt": prompt or f"Allow {request.name} to run with this input?",
        "input": dict(request.input),
        "details": details,
    }


def _nested(schema: JsonObject, base: str) -> JsonObject:
    """``schema`` moved under ``base``: its local references (``#...``) are rewritten."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            moved = {key: walk(value) for key, value in node.items()}
            ref = moved.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                moved["$ref"] = base + ref[1:]
            return moved
        if isinstance(node, list):
            return [walk(item) for item in node]
        return node

    nested: dict[str, Any] = walk(copy.deepcopy(dict(schema)))
    nested.pop("$schema", None)
    return nested
