"""Who a call is for: the trusted principal and the caller's untrusted data.

A ``CallContext`` travels with a call (``runtime.call(..., context=...)``): it is stored with the
call and its pending actions, so recovery, permissions and tenant checks in any process see the
same principal. The principal is trusted (the application authenticated it); ``client_data`` is
not (the client sent it) and is only ever passed on, never used for a decision by the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import JsonValue

OPERATOR = "operator"
"""The role that sees every tenant's calls and actions."""


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: its id, its tenant and its roles (``operator`` sees all)."""

    id: str
    tenant: str
    roles: frozenset[str] = frozenset()
    # What else the application keeps about the principal (JSON); never in reprs or logs.
    claims: JsonValue = field(default=None, repr=False)

    @property
    def operator(self) -> bool:
        return OPERATOR in self.roles

    def may_see(self, tenant: str) -> bool:
        """Whether records of ``tenant`` exist for this principal."""
        return self.operator or tenant == self.tenant

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "roles": list[JsonValue](sorted(self.roles)),
            "claims": self.claims,
        }

    @staticmethod
    def from_json(data: Any) -> Principal | None:
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            return None
        roles = data.get("roles") or ()
        return Principal(
            data["id"], str(data.get("tenant", "")), frozenset(map(str, roles)), data.get("claims")
        )


@dataclass(frozen=True, slots=True)
class CallContext:
    """The caller's side of a call: the trusted principal, untrusted client data, the thread
    it belongs to and the agent that runs it (``agent_id``: its registry id or its own name,
    as the adapter or the application names it; seed 002's ``ctx.agentId``)."""

    principal: Principal | None = None
    client_data: JsonValue = field(default=None, repr=False)  # untrusted: never in logs
    thread_id: str | None = None
    extra: dict[str, JsonValue] = field(default_factory=dict, repr=False)
    agent_id: str | None = None

    @property
    def tenant(self) -> str:
        return "" if self.principal is None else self.principal.tenant

    def to_json(self) -> JsonValue:
        return {
            "principal": None if self.principal is None else self.principal.to_json(),
            "client_data": self.client_data,
            "thread_id": self.thread_id,
            "agent_id": self.agent_id,
            "extra": dict(self.extra),
        }

    def placed(self, agent_id: str | None, thread_id: str | None = None) -> CallContext:
        """This context with ``agent_id`` and ``thread_id`` where it names none: an adapter
        fills them from its framework's agent and conversation, and what the application gave
        wins."""
        agent = self.agent_id if self.agent_id is not None else agent_id
        thread = self.thread_id if self.thread_id is not None else thread_id
        if agent == self.agent_id and thread == self.thread_id:
            return self
        return replace(self, agent_id=agent, thread_id=thread)

    @staticmethod
    def from_json(data: JsonValue) -> CallContext | None:
        if not isinstance(data, dict):
            return None
        thread = data.get("thread_id")
        agent = data.get("agent_id")
        extra = data.get("extra")
        return CallContext(
            Principal.from_json(data.get("principal")),
            data.get("client_data"),
            thread if isinstance(thread, str) else None,
            dict(extra) if isinstance(extra, dict) else {},
            agent if isinstance(agent, str) else None,
        )


def may_act_on(principal: Principal | None, tenant: str, context: JsonValue) -> bool:
    """Whether ``principal`` may see, answer or resume a call recorded for ``tenant`` with the
    stored ``context`` (``CallRecord.tenant`` and ``.context``): the same tenant and, where the
    call was made for a principal, that principal; an operator may act on any. What a client
    sends back (an action id, a message history, a tool call id) never decides this."""
    if principal is not None and principal.operator:
        return True
    if tenant != ("" if principal is None else principal.tenant):
        return False
    stored = CallContext.from_json(context)
    owner = None if stored is None else stored.principal
    if owner is None:
        return True  # an anonymous call: its tenant decides
    return principal is not None and principal.id == owner.id
