"""Lease fencing: ``ctx.lease`` for a tool whose spec asks for it (``"lease": true``).

Every entry of a stored call runs under a claim: the call's owner and its fencing token, which the
store sets to 1 at the call's start and raises by one at every claim and re-entry (a resume, a
recovery's replay), whichever worker makes it. So a worker that stalled past its lease, whose call
another worker took over, holds a smaller token than the new owner: an external system that
remembers the largest token it has seen refuses the stale worker's write. ``assert_held()`` asks
the store, at the moment of the call, whether this entry's claim still stands (the owner, the
token, and a lease that has not expired by the store's clock); a worker that lost it learns so
before a non-idempotent write rather than after. The store itself refuses every write of an
entry whose claim another worker took (its ToolData, files, triggers and result): the tool
then ends as LEASE_LOST.
"""

from __future__ import annotations

from blade_runtime.core.storage import StoreAccess
from blade_runtime.core.store import Claim


class LeaseNotHeld(BaseException):
    """Raised by ``ctx.lease.assert_held()``: another worker holds the call now (or may take it
    at any moment: the lease expired). The call ends as LEASE_LOST, and nothing it reports is
    recorded. A BaseException, so that an implementation's ``except Exception`` does not go on
    to the write it guards."""

    def __init__(self, call_id: str, fencing_token: int) -> None:
        super().__init__(
            f"call {call_id} is no longer held by this entry (fencing token {fencing_token}): "
            "another worker claimed it, or its lease expired"
        )
        self.call_id = call_id
        self.fencing_token = fencing_token


class Lease:
    """``ctx.lease``: this entry's claim on its call."""

    __slots__ = ("_claim", "_io")

    def __init__(self, io: StoreAccess, claim: Claim) -> None:
        self._io = io
        self._claim = claim

    @property
    def fencing_token(self) -> int:
        """Grows with every claim of the call (stored: monotonic across workers and restarts).
        Pass it to an external system with a write, for it to refuse a smaller one."""
        return self._claim.fence

    async def held(self) -> bool:
        """Whether the store says this entry still holds the call."""
        held: bool = await self._io(self._io.store.held, self._claim)
        return held

    async def assert_held(self) -> None:
        """Raise ``LeaseNotHeld`` unless the store says this entry still holds the call."""
        if not await self.held():
            raise LeaseNotHeld(self._claim.call_id, self._claim.fence)
