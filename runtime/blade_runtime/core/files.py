"""``ctx.files``: durable files a tool saves and reads, bound to its call's trusted scope.

A file belongs to the tenant of the call that saved it, and records its creator (the principal's
id) and thread: all three come from the caller context the runtime stored with the call, never
from the tool's input. A read is authorized by tenant: a file of another tenant is the same
``UnknownFile`` as an id that was never saved, so its existence is not told.

Where files live: the runtime's store by default (every store keeps them: memory, SQLite,
PostgreSQL), or a folder the application names (``Runtime(files=FolderFiles(path))``). A file is
at most ``DEFAULT_MAX_FILE_BYTES`` unless the runtime says otherwise (``max_file_bytes``); a larger
one is refused with ``FileRejected`` before anything is written. A save is one transaction (a
folder's: its content is renamed into place, its metadata last), so nothing is half-written, and a
save whose call is cancelled meanwhile is not kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from blade_runtime.core.context import CallInfo, CancellationSignal
from blade_runtime.core.fencing import LeaseNotHeld
from blade_runtime.core.store import (
    Claim,
    FileRecord,
    LeaseLost,
    SaveStopped,
    StoreUnavailable,
    now,
)

log = logging.getLogger("blade_runtime")

DEFAULT_MAX_FILE_BYTES = 10 * 1024 * 1024
"""The largest file ``ctx.files.save`` takes unless ``Runtime(max_file_bytes=...)`` says."""

DEFAULT_MEDIA_TYPE = "application/octet-stream"

_FILE_ID = re.compile(r"file_[0-9a-f]{32}")
_TOKEN = r"[A-Za-z0-9!#$&^_.+-]+"
# type/subtype with optional parameters: what reaches a Content-Type header, never a line break.
# Space and tab only around ";" (\s takes line breaks). A quoted value is printable ASCII without "
# or \: a header is Latin-1 at best, and re.ASCII does not narrow a negated class, so it lists.
_MEDIA_TYPE = re.compile(
    rf'{_TOKEN}/{_TOKEN}([ \t]*;[ \t]*{_TOKEN}=({_TOKEN}|"[\x20\x21\x23-\x5b\x5d-\x7e]*"))*',
    re.ASCII,
)
_CHUNK = 1 << 20  # a folder's file is written (and its cancellation checked) a MiB at a time

StoreIO = Callable[..., Awaitable[Any]]


class FileRejected(ValueError):
    """A save refused before anything was written: a bad name or media type, or too large."""


class UnknownFile(LookupError):
    """No file with that id for this scope (never saved, or another tenant's: the same)."""

    def __init__(self, file_id: str) -> None:
        super().__init__(f"no file {file_id!r}")
        self.file_id = file_id


@dataclass(frozen=True, slots=True)
class SavedFile:
    """A stored file, as ``ctx.files.save`` returns it: put ``file_id`` in the typed output."""

    file_id: str
    name: str
    media_type: str
    size: int
    sha256: str
    created_at: str
    thread_id: str | None = None


@dataclass(frozen=True, slots=True)
class FileBody:
    """A stored file and its content (``ctx.files.read``, ``runtime.records.file``)."""

    file: SavedFile
    content: bytes


class FileBackend(Protocol):
    """Where files live: every store is one, and so is ``FolderFiles``. A store fences a save
    by the ``claim`` its call's entry holds; another backend is given ``keep``, which asks."""

    def save_file(
        self,
        record: FileRecord,
        content: bytes,
        *,
        claim: Claim | None = None,
        keep: Callable[[], bool] | None = None,
    ) -> None: ...

    def delete_file(self, file_id: str) -> bool: ...

    def file(self, file_id: str) -> FileRecord | None: ...

    def file_content(self, file_id: str) -> bytes | None: ...


def new_file_id() -> str:
    """128 random bits: an id is not guessable, whoever learns one reads only in its tenant."""
    return f"file_{uuid.uuid4().hex}"


def is_file_id(text: str) -> bool:
    return isinstance(text, str) and _FILE_ID.fullmatch(text) is not None


def saved(record: FileRecord) -> SavedFile:
    return SavedFile(
        record.file_id,
        record.name,
        record.media_type,
        record.size,
        record.sha256,
        record.created_at,
        record.thread_id,
    )


class FolderFiles:
    """Files in a folder the application names (shared by the processes of one machine, or a
    network file system's): ``<id>.bin`` holds the content and ``<id>.json`` the metadata,
    written last, so a file exists once both are in place."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StoreUnavailable(f"{self.folder}: {error.strerror or error}") from None

    def save_file(
        self,
        record: FileRecord,
        content: bytes,
        *,
        claim: Claim | None = None,
        keep: Callable[[], bool] | None = None,
    ) -> None:
        """``claim`` is not checked here (a folder knows no calls): ``keep`` is, to the last."""
        body, meta = self._paths(record.file_id)
        parts = [body.with_name(f".{body.name}.tmp"), meta.with_name(f".{meta.name}.tmp")]
        try:
            with open(parts[0], "xb") as out:
                for start in range(0, len(content), _CHUNK):
                    if keep is not None and not keep():
                        raise SaveStopped(f"file {record.file_id} was not kept")
                    out.write(content[start : start + _CHUNK])
                out.flush()
                os.fsync(out.fileno())
            with open(parts[1], "x", encoding="utf-8") as out:
                json.dump(asdict(record), out)
                out.flush()
                os.fsync(out.fileno())
            if keep is not None and not keep():
                raise SaveStopped(f"file {record.file_id} was not kept")
            os.replace(parts[0], body)
            os.replace(parts[1], meta)  # from here on the file exists
        except OSError as error:
            self._remove(*parts, body)
            raise StoreUnavailable(f"{self.folder}: {error.strerror or error}") from None
        except BaseException:
            self._remove(*parts, body)
            raise

    def delete_file(self, file_id: str) -> bool:
        if not is_file_id(file_id):
            return False
        body, meta = self._paths(file_id)
        there = meta.exists()
        self._remove(meta, body)  # the metadata first: from then on the file does not exist
        return there

    def file(self, file_id: str) -> FileRecord | None:
        if not is_file_id(file_id):
            return None
        try:
            data = json.loads(self._paths(file_id)[1].read_text("utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            raise StoreUnavailable(f"{self.folder}: file {file_id}: {error}") from None
        return FileRecord(**data)

    def file_content(self, file_id: str) -> bytes | None:
        if self.file(file_id) is None:
            return None
        try:
            return self._paths(file_id)[0].read_bytes()
        except OSError as error:
            raise StoreUnavailable(f"{self.folder}: file {file_id}: {error}") from None

    def _paths(self, file_id: str) -> tuple[Path, Path]:
        return self.folder / f"{file_id}.bin", self.folder / f"{file_id}.json"

    @staticmethod
    def _remove(*paths: Path) -> None:
        for path in paths:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)


class FileAccess:
    """The runtime's files: its backend, reached off the event loop (the store's own
    ``StoreAccess``, or a thread for a folder), and the size limit."""

    def __init__(
        self,
        backend: FileBackend,
        io: StoreIO | None,
        max_bytes: int,
        held: Callable[[Claim], bool] | None = None,
    ) -> None:
        """``io``: the store's access when the backend is the store (which fences a save in its
        transaction); else ``held`` asks the store whether a claim still stands."""
        if max_bytes < 1:
            raise ValueError("max_file_bytes must be a positive number of bytes")
        self.backend = backend
        self.max_bytes = max_bytes
        self._io = io
        self._held = held

    async def _run(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._io is not None:
            return await self._io(method, *args, **kwargs)
        return await asyncio.to_thread(method, *args, **kwargs)

    async def read(self, file_id: str, tenant: str | None) -> FileBody | None:
        """The file ``file_id`` if it is of ``tenant`` (None: any tenant), with its content."""
        if not is_file_id(file_id):
            return None
        record: FileRecord | None = await self._run(self.backend.file, file_id)
        if record is None or (tenant is not None and record.tenant != tenant):
            return None
        content: bytes | None = await self._run(self.backend.file_content, file_id)
        return None if content is None else FileBody(saved(record), content)

    async def save(
        self,
        call: CallInfo,
        signal: CancellationSignal,
        name: str,
        content: Any,
        media_type: str,
        claim: Claim | None = None,
    ) -> SavedFile:
        body = _content(name, content)
        where = f"ctx.files.save({name!r})"
        if not isinstance(name, str) or not (0 < len(name) <= 255) or not name.isprintable():
            raise FileRejected(f"{where}: a name is 1 to 255 printable characters")
        if "/" in name or "\\" in name:
            raise FileRejected(f"{where}: a name has no / or \\ (it is a file name, not a path)")
        if not isinstance(media_type, str) or not _MEDIA_TYPE.fullmatch(media_type):
            raise FileRejected(
                f"{where}: {media_type!r} is not a media type (type/subtype, such as text/csv)"
            )
        if len(body) > self.max_bytes:
            raise FileRejected(
                f"{where}: {len(body)} bytes is over the limit of {self.max_bytes} bytes "
                "(Runtime(max_file_bytes=...) sets it)"
            )
        context = call.context
        principal = None if context is None else context.principal
        record = FileRecord(
            new_file_id(),
            "" if context is None else context.tenant,
            name,
            media_type,
            len(body),
            hashlib.sha256(body).hexdigest(),
            now(),
            call.parent or call.call_id,
            call.run_id,
            None if principal is None else principal.id,
            None if context is None else context.thread_id,
        )
        if signal.cancelled:
            raise asyncio.CancelledError(signal.reason)
        held = self._held

        def keep() -> bool:
            if signal.cancelled:
                return False
            if held is not None and claim is not None and not held(claim):
                raise LeaseLost(claim.call_id, claim.owner)
            return True

        saving = asyncio.ensure_future(
            self._run(self.backend.save_file, record, body, claim=claim, keep=keep)
        )
        # Its failure is read here, or by _taken_back; a second cancellation while the latter
        # waits would leave it unread (asyncio logs "exception was never retrieved").
        saving.add_done_callback(_read_outcome)
        try:
            await asyncio.shield(saving)
        except asyncio.CancelledError:
            # Cancelled while the save may be committing: wait for its end, and take back what
            # it kept, so that a cancelled save leaves nothing, wherever the cancellation landed.
            await self._taken_back(saving, record.file_id)
            raise
        except SaveStopped:
            raise asyncio.CancelledError(signal.reason) from None
        except LeaseLost as lost:  # another worker holds the call: this entry ends
            raise LeaseNotHeld(lost.call_id, -1 if claim is None else claim.fence) from None
        return saved(record)

    async def _taken_back(self, saving: asyncio.Future[Any], file_id: str) -> None:
        await asyncio.wait({saving})
        if saving.cancelled() or saving.exception() is not None:
            return  # nothing was stored
        try:
            await asyncio.shield(self._run(self.backend.delete_file, file_id))
        except Exception as error:
            log.error("file %s of a cancelled save could not be removed: %s", file_id, error)


def _content(name: Any, content: Any) -> bytes:
    if isinstance(content, bytes):
        return content
    if isinstance(content, bytearray | memoryview):
        return bytes(content)
    if isinstance(content, str):
        try:
            return content.encode()
        except UnicodeEncodeError:
            raise FileRejected(
                f"ctx.files.save({name!r}): the text is not valid Unicode (a lone surrogate)"
            ) from None
    raise FileRejected(
        f"ctx.files.save({name!r}): the content is bytes or str, not {type(content).__name__}"
    )


class ScopedFiles:
    """``ctx.files`` of one call: saves under the call's stored scope, reads within its tenant."""

    __slots__ = ("_access", "_call", "_claim", "_signal")

    def __init__(
        self,
        access: FileAccess,
        call: CallInfo,
        signal: CancellationSignal,
        claim: Claim | None = None,
    ) -> None:
        self._access = access
        self._call = call
        self._signal = signal
        self._claim = claim

    async def save(
        self, name: str, content: bytes | str, media_type: str = DEFAULT_MEDIA_TYPE
    ) -> SavedFile:
        """Store ``content`` as the file ``name``; returns it, with the ``file_id`` to hand on.
        ``FileRejected`` (nothing written) for a bad name or media type or a file over the
        limit; a save whose call is cancelled meanwhile is not kept."""
        return await self._access.save(
            self._call, self._signal, name, content, media_type, self._claim
        )

    async def read(self, file_id: str) -> FileBody:
        """The file ``file_id`` of this call's tenant, or ``UnknownFile``."""
        context = self._call.context
        found = await self._access.read(file_id, "" if context is None else context.tenant)
        if found is None:
            raise UnknownFile(file_id)
        return found


def _read_outcome(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()
