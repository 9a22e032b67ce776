"""HTTP statuses of the runtime's error codes, and the codes only the HTTP layer has.

Every error body is ``{"code": ..., "message": ...}``: one line, meant for people and programs,
never a traceback and never a credential.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from blade_runtime.core.results import ErrorCode


class HttpError(StrEnum):
    """Codes of requests the API refuses before the runtime sees them."""

    UNAUTHENTICATED = "UNAUTHENTICATED"
    """No credentials, or credentials the application's ``authenticate`` did not accept."""
    ANONYMOUS_REFUSED = "ANONYMOUS_REFUSED"
    """Anonymous access is allowed only on a server bound to loopback, from loopback."""
    HOST_NOT_ALLOWED = "HOST_NOT_ALLOWED"
    """The request's ``Host`` is none of the names the server answers (a DNS-rebinding page's)."""
    ORIGIN_NOT_ALLOWED = "ORIGIN_NOT_ALLOWED"
    """A browser page of another origin sent the request (a cross-site request)."""
    NOT_FOUND = "NOT_FOUND"
    """No such route."""
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    UNKNOWN_CALL = "UNKNOWN_CALL"
    """No call with that id exists for the principal."""
    UNKNOWN_RUN = "UNKNOWN_RUN"
    """No call of that run exists for the principal."""
    UNKNOWN_FILE = "UNKNOWN_FILE"
    """No file with that id exists for the principal's tenant."""
    UNKNOWN_GRANT = "UNKNOWN_GRANT"
    """No standing grant with that id exists for the principal's tenant."""
    MALFORMED_REQUEST = "MALFORMED_REQUEST"
    """The body is not JSON, or a parameter has the wrong form."""
    BODY_TOO_LARGE = "BODY_TOO_LARGE"
    HEADERS_TOO_LARGE = "HEADERS_TOO_LARGE"
    """The request's headers are larger than ``MAX_HEADER_BYTES``."""
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
    IDEMPOTENCY_CONFLICT = "IDEMPOTENCY_CONFLICT"
    """The idempotency key (call id) is taken by another call (other arguments, tool or
    caller), or by a call that ran whose answer is no longer kept."""
    CALL_IN_PROGRESS = "CALL_IN_PROGRESS"
    """A call with this idempotency key is still running elsewhere; retry later."""
    BAD_CURSOR = "BAD_CURSOR"
    """A page's cursor that names no record this listing could have given (another
    principal's, pruned since, or no cursor at all): list from the first page."""
    TOO_MANY_STREAMS = "TOO_MANY_STREAMS"
    """The principal has as many event streams open as the server allows; close one."""
    NOT_SERVED = "NOT_SERVED"
    """A route of the API this server does not serve (the Temporal app: event streams, files,
    a run's calls, grants); the message says why and where to go instead."""
    INTERNAL = "INTERNAL"


MAX_HEADER_BYTES: Final = 64 * 1024
"""The largest request head served (the request line and the headers, names and values)."""

STATUS: Final[dict[str, int]] = {
    ErrorCode.INVALID_INPUT: 422,
    ErrorCode.INVALID_OUTPUT: 502,
    ErrorCode.TOOL_FAILED: 424,
    ErrorCode.TOOL_ERROR: 500,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.CANCELLED: 409,
    ErrorCode.TOOL_HANDLER_NOT_FOUND: 404,
    ErrorCode.TOOL_NOT_ALLOWED: 403,
    ErrorCode.TOOL_UNAVAILABLE: 503,
    ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.HOOK_ABORTED: 403,
    ErrorCode.HOOK_FAILED: 500,
    ErrorCode.HOOK_TIMEOUT: 504,
    ErrorCode.INVALID_SUBMISSION: 422,
    ErrorCode.UNKNOWN_ACTION: 404,
    ErrorCode.ACTION_ALREADY_RESOLVED: 409,
    ErrorCode.INTERRUPTED: 500,
    ErrorCode.DUPLICATE_CALL: 409,
    ErrorCode.OBSERVER_FAILED: 500,
    ErrorCode.LEASE_LOST: 409,
    ErrorCode.POLICY_FAILED: 500,
    ErrorCode.STORE_UNAVAILABLE: 503,
    HttpError.UNAUTHENTICATED: 401,
    HttpError.ANONYMOUS_REFUSED: 403,
    HttpError.HOST_NOT_ALLOWED: 421,
    HttpError.ORIGIN_NOT_ALLOWED: 403,
    HttpError.NOT_FOUND: 404,
    HttpError.METHOD_NOT_ALLOWED: 405,
    HttpError.UNKNOWN_CALL: 404,
    HttpError.UNKNOWN_RUN: 404,
    HttpError.UNKNOWN_FILE: 404,
    HttpError.UNKNOWN_GRANT: 404,
    HttpError.MALFORMED_REQUEST: 400,
    HttpError.BODY_TOO_LARGE: 413,
    HttpError.HEADERS_TOO_LARGE: 431,
    HttpError.UNSUPPORTED_MEDIA_TYPE: 415,
    HttpError.IDEMPOTENCY_CONFLICT: 409,
    HttpError.CALL_IN_PROGRESS: 409,
    HttpError.BAD_CURSOR: 400,
    HttpError.TOO_MANY_STREAMS: 429,
    HttpError.NOT_SERVED: 501,
    HttpError.INTERNAL: 500,
}
"""One HTTP status per code (a runtime code the table lacks is a 500, and a test says so)."""


def status_of(code: str) -> int:
    return STATUS.get(code, 500)


def one_line(message: str) -> str:
    """Messages go out as one line."""
    return " ".join(message.split())
