"""The answers a retry of a keyed call gets where the store keeps no record of the call.

The store's record of a call (its id is the ``Idempotency-Key``) is the idempotency record:
durable where the call is, shared by every server on the store, as long as the store keeps the
call. Only a call that ran and that the store does not record (a ``MemoryStore``'s call that
neither waited nor was kept, or a fallback handler's) has its first answer kept here, in this
process: the answer as sent and a fingerprint of the request (the tool's name and a hash of its
arguments, never the arguments), for ``ttl_s``, at most ``per_principal`` of them per principal
(the oldest forgotten first) and at most ``bytes_per_principal`` of answers (past it the oldest
answers are let go, their fingerprints kept: a retry of one is refused rather than run again).
A request refused before anything ran (an invalid body, invalid arguments, a tool that is not
there or not allowed) keeps nothing: it can be sent again, with the same key, as it is or fixed.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from pydantic import JsonValue

from blade_runtime.core.caller import Principal
from blade_runtime.core.results import ErrorCode

DEFAULT_TTL_S: Final = 24 * 3600.0
DEFAULT_PER_PRINCIPAL: Final = 1000
DEFAULT_BYTES_PER_PRINCIPAL: Final = 16 << 20

NOTHING_RAN: Final = frozenset(
    {
        ErrorCode.INVALID_INPUT,
        ErrorCode.TOOL_HANDLER_NOT_FOUND,
        ErrorCode.TOOL_NOT_ALLOWED,
        ErrorCode.TOOL_UNAVAILABLE,
        ErrorCode.PERMISSION_DENIED,
        ErrorCode.HOOK_ABORTED,
        ErrorCode.DUPLICATE_CALL,
        ErrorCode.STORE_UNAVAILABLE,
    }
)
"""Codes of answers given before the implementation was entered: nothing to keep."""


def fingerprint(name: str, arguments: JsonValue) -> str:
    """The request a key was used for: its tool and a hash of its arguments (key order and
    spacing aside, as the store compares a stored call's input)."""
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{name}:{digest}"


@dataclass(slots=True)
class Answer:
    """A keyed call's first answer, kept for its retries."""

    tenant: str
    context: JsonValue  # the caller's CallContext as JSON: who may retry or read it
    name: str
    fingerprint: str
    status: int
    body: bytes | None  # the answer as sent; None once let go to stay within the budget
    run_id: str
    expires: float  # time.monotonic()


class Answers:
    """The kept answers, by key, each principal's bounded on its own."""

    def __init__(
        self,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        per_principal: int = DEFAULT_PER_PRINCIPAL,
        bytes_per_principal: int = DEFAULT_BYTES_PER_PRINCIPAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.per_principal = per_principal
        self.bytes_per_principal = bytes_per_principal
        self.clock = clock
        self._by_key: dict[str, tuple[str, str]] = {}  # key -> its principal
        self._of: dict[tuple[str, str], OrderedDict[str, Answer]] = {}  # oldest first
        self._bytes: dict[tuple[str, str], int] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, key: str) -> Answer | None:
        owner = self._by_key.get(key)
        if owner is None:
            return None
        answer = self._of[owner][key]
        if answer.expires <= self.clock():
            self._drop(owner, key)
            return None
        return answer

    def keep(self, key: str, principal: Principal, answer: Answer) -> None:
        owner = (principal.tenant, principal.id)
        if key in self._by_key:
            self._drop(self._by_key[key], key)
        kept = self._of.setdefault(owner, OrderedDict())
        self._expire(owner)
        answer.expires = self.clock() + self.ttl_s
        kept[key] = answer
        self._by_key[key] = owner
        self._bytes[owner] = self._bytes.get(owner, 0) + len(answer.body or b"")
        while len(kept) > self.per_principal:
            self._drop(owner, next(iter(kept)))
        if self._bytes[owner] > self.bytes_per_principal:
            for older in kept.values():  # oldest first: their answers go, their prints stay
                if older.body is not None:
                    self._bytes[owner] -= len(older.body)
                    older.body = None
                    if self._bytes[owner] <= self.bytes_per_principal:
                        break

    def bytes_of(self, principal: Principal) -> int:
        return self._bytes.get((principal.tenant, principal.id), 0)

    def _expire(self, owner: tuple[str, str]) -> None:
        kept = self._of[owner]
        now = self.clock()
        while kept:
            key, oldest = next(iter(kept.items()))
            if oldest.expires > now:
                return
            self._drop(owner, key)

    def _drop(self, owner: tuple[str, str], key: str) -> None:
        kept = self._of[owner]
        answer = kept.pop(key)
        del self._by_key[key]
        self._bytes[owner] -= len(answer.body or b"")
        if not kept:
            del self._of[owner], self._bytes[owner]
