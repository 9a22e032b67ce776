"""Effects: what a running tool changes beyond its result (seed 000's ``kind: 'effect'``).

A spec declares the effects its tool may emit (``"effects"``: a ``context`` patch schema, a
``message`` schema, and the tools whose ``permissions`` it may change), so they are typed and
reviewed like every other slot; the implementation emits them through ``ctx.effects``:

- ``await ctx.effects.patch_context(patch)``: a JSON merge patch (RFC 7396) of its **run's
  context**, which every later call of the run reads (``await ctx.run_context()``,
  ``Runtime.run_context``, ``GET /v1/runs/{run}/context``);
- ``await ctx.effects.post_message(message)``: a message for the run's conversation, which the
  adapters hand to their framework where it has a place for one;
- ``await ctx.effects.grant(tool, subject=...)`` and ``revoke(...)``: a standing permission
  grant of the call's principal for a tool the spec names (see ``core.grants``).

Each effect is validated against its declaration, then recorded with its call's durability: one
transaction holds the effect, what it changes in the store (a grant) and its ``effect`` event of
the run, fenced by the entry's claim (a worker that lost its lease changes nothing). Its id comes
from its place in the entry (the n-th effect of the initial entry, or of a resume), so an entry
run again after a crash emits it again without applying it twice. Every effect is scoped to its
call's tenant and principal: a run's context is the one of whoever the run's calls are for, and a
grant is only ever the caller's own, checked where a person would otherwise be asked, after the
permission policy (whose denial still stands).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pydantic import JsonValue

from blade_runtime.core.context import CallInfo, event_of
from blade_runtime.core.fencing import LeaseNotHeld
from blade_runtime.core.grants import new_grant
from blade_runtime.core.jsonvalue import NotJson, lossless
from blade_runtime.core.permissions import ADMISSION, STEP
from blade_runtime.core.registry import EffectSlots, Typed
from blade_runtime.core.storage import StoreAccess
from blade_runtime.core.store import (
    Claim,
    EffectKind,
    EffectRecord,
    Event,
    GrantRecord,
    LeaseLost,
    now,
)

CONTEXT_PATCH: EffectKind = "context_patch"
MESSAGE: EffectKind = "message"
PERMISSION: EffectKind = "permission"
KINDS: dict[str, EffectKind] = {kind: kind for kind in (CONTEXT_PATCH, MESSAGE, PERMISSION)}


class EffectRejected(ValueError):
    """An effect its spec does not declare, or whose value its declaration rejects: nothing was
    recorded. Raised by ``ctx.effects``; a tool that does not catch it fails as TOOL_ERROR."""


@dataclass(frozen=True, slots=True)
class Effect:
    """One effect as a result, an event and a listing carry it: ``type`` is ``context_patch``
    (``value``: the patch), ``message`` (``value``: the message) or ``permission`` (``value``:
    ``{"change": "grant" | "revoke", "tool", "spec_id", "point", "subject"}``)."""

    effect_id: str
    type: EffectKind
    value: JsonValue
    at: str

    def to_json(self) -> dict[str, JsonValue]:
        return {"effect_id": self.effect_id, "type": self.type, "value": self.value, "at": self.at}

    @staticmethod
    def from_json(data: JsonValue) -> Effect | None:
        """An effect from ``to_json``'s form (None: not one)."""
        kind = data.get("type") if isinstance(data, dict) else None
        if not isinstance(data, dict) or not isinstance(kind, str) or kind not in KINDS:
            return None
        return Effect(
            str(data.get("effect_id")), KINDS[kind], data.get("value"), str(data.get("at"))
        )

    @staticmethod
    def of(record: EffectRecord) -> Effect:
        return Effect(record.effect_id, record.kind, record.value, record.at)


def effects_json(effects: Iterable[Effect]) -> list[JsonValue]:
    """Effects as every surface carries them (a stored result, HTTP, MCP, the adapters)."""
    return [effect.to_json() for effect in effects]


def effects_from_json(listed: JsonValue) -> tuple[Effect, ...]:
    """The effects ``effects_json`` wrote (what is not one is left out)."""
    found = (Effect.from_json(item) for item in listed) if isinstance(listed, list) else ()
    return tuple(effect for effect in found if effect is not None)


def merge_patch(target: JsonValue, patch: JsonValue) -> JsonValue:
    """``target`` with the JSON merge patch ``patch`` applied (RFC 7396): an object's members
    merge key by key, ``null`` removes one, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    merged: dict[str, JsonValue] = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def folded(records: Iterable[EffectRecord]) -> dict[str, JsonValue]:
    """A run's context: its context patches, applied in the order they were recorded."""
    context: JsonValue = {}
    for record in records:
        context = merge_patch(context, record.value)
    return context if isinstance(context, dict) else {}


class Effects:
    """The runtime's side of effects: records them, and reads a run's context."""

    def __init__(
        self, io: StoreAccess, publish: Callable[[Event], None], registered: Callable[[], Any]
    ) -> None:
        self.io = io
        self.store = io.store
        self.publish = publish
        self.registered = registered  # the runtime's registrations by name (aliases too)

    async def record(
        self,
        call: CallInfo,
        kind: EffectKind,
        value: JsonValue,
        *,
        key: str,
        claim: Claim | None,
        grant: GrantRecord | None = None,
        revoke: GrantRecord | None = None,
    ) -> Effect:
        """Record one effect of ``call`` (``key``: its place in the entry, which makes its id)
        and announce it; an effect recorded already is neither applied nor announced again."""
        tenant, principal = call.tenant, call.principal_id
        # whose it is in the id too: a call id is the caller's choice, and one reused by
        # another tenant (on a store that records no such call) never meets this effect
        place = f"{tenant}\x00{principal}\x00{key}"
        effect_id = f"eff_{hashlib.sha256(place.encode()).hexdigest()[:32]}"
        effect = Effect(effect_id, kind, value, now())
        call_id = call.parent or call.call_id  # a child's effects are its parent's part
        record = EffectRecord(
            effect_id, call.run_id, call_id, tenant, principal, kind, value, effect.at
        )
        event = replace(event_of(call, "effect", effect.to_json(), effect.at), call_id=call_id)
        try:
            added = await self.io(
                self.store.add_effect, record, event, claim=claim, grant=grant, revoke=revoke
            )
        except LeaseLost as lost:  # another worker holds the call: this entry ends
            raise LeaseNotHeld(lost.call_id, -1 if claim is None else claim.fence) from None
        if added is not None:
            self.publish(added)
        return effect

    async def run_context(self, run_id: str, tenant: str, principal: str) -> dict[str, JsonValue]:
        """The context of ``run_id`` for the calls made for ``tenant`` and ``principal``."""
        records = await self.io.thread(
            self.store.effects, run_id, tenant=tenant, principal=principal, kind=CONTEXT_PATCH
        )
        return folded(records)

    async def listed(
        self,
        run_id: str,
        tenant: str,
        principal: str,
        kind: EffectKind | None = None,
        *,
        call_id: str | None = None,
    ) -> tuple[Effect, ...]:
        """The effects of ``run_id``'s calls made for ``tenant`` and ``principal`` (of one
        outer call and its children: ``call_id``), in order, as stored."""
        records = await self.io.thread(
            self.store.effects,
            run_id,
            tenant=tenant,
            principal=principal,
            kind=kind,
            call_id=call_id,
        )
        return tuple(Effect.of(record) for record in records)


class CallEffects:
    """``ctx.effects``: the effects one entry of a call emits, as its spec declares them."""

    __slots__ = ("_call", "_claim", "_count", "_execution", "_services", "_slots", "emitted")

    def __init__(
        self,
        services: Effects,
        call: CallInfo,
        slots: EffectSlots | None,
        claim: Claim | None,
        execution: str,
    ) -> None:
        self._services = services
        self._call = call  # the whole call: its principal, whatever the implementation sees
        self._slots = slots
        self._claim = claim
        # "initial", or the action whose resume began this execution (a permission's answer
        # replays the execution it stopped: see ToolContext._execution)
        self._execution = execution
        self._count = 0
        self.emitted: list[Effect] = []

    async def patch_context(self, patch: Any) -> Effect:
        """Patch the run's context (a JSON merge patch: ``null`` removes a key); later calls
        of the run read the result (``ctx.run_context()``)."""
        value = self._valid(self._slot("context", "patch_context"), patch, "context patch")
        if not isinstance(value, dict):
            raise EffectRejected(f"{self._call.spec_id}: a context patch is a JSON object")
        return await self._emit(CONTEXT_PATCH, value)

    async def post_message(self, message: Any) -> Effect:
        """Add a message to the run's conversation (adapters hand it to their framework)."""
        value = self._valid(self._slot("message", "post_message"), message, "message")
        return await self._emit(MESSAGE, value)

    async def grant(self, tool: Any, *, subject: str | None = None) -> Effect:
        """Let the caller's principal run ``tool`` (its SPEC or a registration name) without a
        person being asked: the call as a whole (``subject`` None), or the steps on
        ``subject`` it asks about with ``ctx.request_permission(..., subject=...)``. A standing
        grant, listed and revoked like one a person made; the policy still decides first."""
        return await self._permission("grant", tool, subject)

    async def revoke(self, tool: Any, *, subject: str | None = None) -> Effect:
        """Take back the caller's standing grant for ``tool`` (and ``subject``), if any."""
        return await self._permission("revoke", tool, subject)

    async def _permission(self, change: str, tool: Any, subject: str | None) -> Effect:
        spec_id = self._call.spec_id
        declared = self._slots.permissions if self._slots is not None else frozenset()
        if not declared:
            raise EffectRejected(
                f"{spec_id}: its spec declares no effects.permissions, so it changes none"
            )
        if subject is not None and not isinstance(subject, str):
            raise EffectRejected(f"{spec_id}: a permission's subject is text")
        if not getattr(self._services.store, "keeps_grants", True):
            raise EffectRejected(
                f"{spec_id}: this runtime's store keeps no standing grants (a Temporal worker's "
                "activity store), so a permission effect would change nothing that lasts"
            )
        registration = self._target(tool, declared)
        context = self._call.context
        principal = None if context is None else context.principal
        if principal is None:
            raise EffectRejected(
                f"{spec_id}: the call is made for no principal, so nobody holds a grant"
            )
        point = ADMISSION if subject is None else STEP
        record = new_grant(principal, registration.name, registration.spec.id, point, subject or "")
        value: JsonValue = {
            "change": change,
            "tool": registration.name,
            "spec_id": registration.spec.id,
            "point": point,
            "subject": subject or "",
        }
        if change == "grant":
            return await self._emit(PERMISSION, value, grant=record)
        return await self._emit(PERMISSION, value, revoke=record)

    def _target(self, tool: Any, declared: frozenset[str]) -> Any:
        """The one registration ``tool`` names (a SPEC or a registration name), of a spec the
        declaration lists."""
        spec_id = self._call.spec_id
        by_name: Mapping[str, Any] = self._services.registered()
        if isinstance(tool, str):
            found = by_name.get(tool)
            if found is None:
                raise EffectRejected(f"{spec_id}: no tool named {tool!r} is registered")
            if found.spec.id not in declared:
                raise EffectRejected(
                    f"{spec_id}: {tool!r} runs {found.spec.id}, which its "
                    f"effects.permissions does not list ({', '.join(sorted(declared))})"
                )
            return found
        wanted = getattr(tool, "id", None)
        if not isinstance(wanted, str) or wanted not in declared:
            raise EffectRejected(
                f"{spec_id}: its effects.permissions lists {', '.join(sorted(declared))}, "
                f"not {wanted!r}"
            )
        named = {r.name: r for r in by_name.values() if r.spec.id == wanted}
        if len(named) != 1:
            where = ", ".join(sorted(named)) or "nowhere"
            raise EffectRejected(
                f"{spec_id}: {wanted} is registered {'as ' if named else ''}{where}: "
                "name the registration"
            )
        return next(iter(named.values()))

    def _slot(self, name: str, method: str) -> Typed:
        typed: Typed | None = None if self._slots is None else getattr(self._slots, name)
        if typed is None:
            raise EffectRejected(
                f"{self._call.spec_id}: its spec declares no effects.{name}, so "
                f"ctx.effects.{method} has nothing to check it against"
            )
        return typed

    def _valid(self, typed: Typed, value: Any, what: str) -> JsonValue:
        try:
            record = lossless(typed.adapter, value)
        except NotJson as error:
            raise EffectRejected(f"{self._call.spec_id}: the {what} is not JSON: {error}") from None
        if not typed.validator.is_valid(record):
            problems = typed.validator.explain(record)
            raise EffectRejected(
                f"{self._call.spec_id}: its effects schema rejected the {what}: {problems}"
            )
        return record

    async def _emit(
        self,
        kind: EffectKind,
        value: JsonValue,
        *,
        grant: GrantRecord | None = None,
        revoke: GrantRecord | None = None,
    ) -> Effect:
        self._count += 1  # the n-th of this execution: the same effect when it runs again
        key = f"{self._call.call_id}\x00{self._execution}\x00{self._count}"
        effect = await self._services.record(
            self._call, kind, value, key=key, claim=self._claim, grant=grant, revoke=revoke
        )
        self.emitted.append(effect)
        return effect
