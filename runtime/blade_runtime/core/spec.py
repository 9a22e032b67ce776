"""Spec objects: what a generated module tells the runtime about one tool.

A spec object is immutable and carries the resolved JSON Schemas (the single truth for validation)
beside the generated pydantic classes (typed access). Its type parameters let mypy hold an
implementation to the spec it is registered for.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, JsonValue

ToolKind = Literal["read_only", "write", "execute"]
SideEffect = Literal["pure", "idempotent", "non_idempotent"]
ExecutionMode = Literal["backend", "client"]
Exposure = Literal["model", "operator"]
"""Where a tool is listed (seed 000's ``exposure``): ``model``, on every surface a model reads
(the export, MCP ``tools/list``, the adapters); ``operator``, only where the application and its
operators call it (``Runtime.call``, the typed client, HTTP, the inbox), never offered to a
model."""
EXPOSURES: tuple[Exposure, ...] = ("model", "operator")
JsonObject = Mapping[str, JsonValue]

IdT = TypeVar("IdT", bound=str, covariant=True)
InputT = TypeVar("InputT", bound=BaseModel, covariant=True)
# Invariant on purpose: ``Runtime.register(spec, implementation)`` solves these from both
# arguments, and a covariant parameter would let mypy widen them to ``object`` and accept an
# implementation returning the wrong type (or a context provider building the wrong context).
OutputT = TypeVar("OutputT")
ContextT = TypeVar("ContextT")
ExecutionT = TypeVar("ExecutionT", contravariant=True)
SuspendT = TypeVar("SuspendT", covariant=True)
ResumeT = TypeVar("ResumeT", covariant=True)
ValueT = TypeVar("ValueT", covariant=True)


def load_schemas(text: str) -> Mapping[str, JsonObject]:
    """Parse the JSON text a generated module embeds its resolved schemas in.

    Generated modules hold schemas as one JSON string literal, never as Python code built from spec
    text, so whatever the schemas contain cannot change the meaning of the module.
    """
    loaded: dict[str, JsonObject] = json.loads(text)
    return loaded


@dataclass(frozen=True)
class DataChannel(Generic[ValueT]):
    """A named ToolData channel: records the tool streams while it runs."""

    name: str
    schema: JsonObject
    type: Any  # the record's type: a generated class or alias (typed by ValueT)


@dataclass(frozen=True)
class SuspendPoint(Generic[SuspendT, ResumeT]):
    """A named wait point: the payload shown while suspended, and the payload that resumes it."""

    name: str
    suspend_schema: JsonObject
    resume_schema: JsonObject
    suspend_type: Any  # generated class or alias (typed by SuspendT)
    resume_type: Any  # generated class or alias (typed by ResumeT)
    expires_after_ms: int | None = None  # past it, the action settles as TIMEOUT


@dataclass(frozen=True)
class CapabilitySpec:
    """A service a tool's implementation needs (``ctx.capabilities.<name>``), and the schema of
    the configuration a registration gives it (``True``: any). ``binding``: the capability's
    id, the key of its binding at the runtime, when the tool names it otherwise in ``ctx``
    (seed 002: ``{box: sandbox}`` reads as ``ctx.capabilities.box``)."""

    name: str
    config_schema: JsonObject | bool = True
    description: str | None = None
    binding: str | None = None

    @property
    def key(self) -> str:
        """The runtime's binding this capability takes."""
        return self.name if self.binding is None else self.binding


@dataclass(frozen=True)
class EffectsSpec:
    """The effects a tool may emit while it runs (``ctx.effects``, see ``core.effects``): a
    patch of its run's context, a message for the run's conversation, each with its schema and
    generated type; and the ids of the tools whose permissions it may grant or revoke."""

    context_schema: JsonObject | None = None
    context_type: Any = None
    message_schema: JsonObject | None = None
    message_type: Any = None
    permissions: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ToolSpec(Generic[IdT, InputT, OutputT]):
    """What every tool has, whichever side executes it.

    The ``*_type`` fields hold what the generated module declares for a slot: a pydantic class, or
    an alias such as ``list[Item]`` where the schema is not an object. ``output_type`` is None when
    the spec has no output schema; the output is then any JSON value.
    """

    id: IdT
    name: str
    description: str
    kind: ToolKind | None
    side_effect: SideEffect
    timeout_ms: int
    fingerprint: str
    source: str
    input_schema: JsonObject
    input_type: type[InputT]
    output_schema: JsonObject | None
    output_type: Any
    data: Mapping[str, DataChannel[Any]] = field(default_factory=dict)
    # The spec package's guidance for the model (its specs/guidance.md): the seed's skills
    # ``{guidance, tools}``. Every tool of the package carries the same text.
    guidance: str | None = None
    # How the tool is shown and found (seed 000's ToolDefinition): a display name for people
    # (MCP ``title``, the inbox), more names a model may call it by, a group, and where it is
    # listed. None of them is part of the wire contract (the fingerprint).
    title: str | None = None
    aliases: tuple[str, ...] = ()
    group: str | None = None
    exposure: Exposure = "model"

    @property
    def execution(self) -> ExecutionMode:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class BackendToolSpec(
    ToolSpec[IdT, InputT, OutputT], Generic[IdT, InputT, OutputT, ContextT, ExecutionT]
):
    """A tool the backend executes.

    ``ExecutionT`` is the typed execution context (``ctx``) its implementation receives;
    ``ContextT`` is the server-only context model (``None`` when the spec has no context schema).
    """

    context_schema: JsonObject | None
    context_type: Any
    suspend: Mapping[str, SuspendPoint[Any, Any]] = field(default_factory=dict)
    children: tuple[str, ...] = ()  # ids of the tools it may call through ``ctx.tools``
    capabilities: Mapping[str, CapabilitySpec] = field(default_factory=dict)
    lease: bool = False  # lease fencing: its implementation gets ``ctx.lease``
    concurrency: int | None = None  # at most this many calls at once, in every worker
    locks: tuple[str, ...] = ()  # JSON pointers into the input: resources a call locks
    effects: EffectsSpec | None = None  # what ctx.effects may emit (None: nothing)
    caller: bool = False
    """Its implementation reads who the call is for: ``ctx.call.context`` whole. Otherwise the
    implementation's ``ctx.call`` has the call's thread but no principal nor client data."""

    @property
    def execution(self) -> ExecutionMode:
        return "backend"


@dataclass(frozen=True, kw_only=True)
class ClientToolSpec(ToolSpec[IdT, InputT, OutputT]):
    """A tool an external client executes: a call becomes a pending action, and the client
    submits the output, validated against the output schema."""

    @property
    def execution(self) -> ExecutionMode:
        return "client"
