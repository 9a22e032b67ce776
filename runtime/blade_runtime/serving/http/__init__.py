"""The runtime over HTTP (``pip install 'blade-runtime[http]'``): ``create_app(runtime,
authenticate=...)`` is a Starlette ASGI app with the JSON API under ``/v1`` (calls, pending
actions, call data, a run's events as Server-Sent Events, an OpenAPI document carrying each
tool's own schemas) and the approval inbox at ``/inbox``; ``HttpTransport`` gives the generated
typed ``Client`` the same calls against a remote runtime.
"""

from __future__ import annotations

from blade_runtime.client.http import HttpTransport, RemoteRefused
from blade_runtime.serving.http.app import DEFAULT_MAX_BODY_BYTES, create_app
from blade_runtime.serving.http.auth import DEFAULT_AUTH_THREADS, Authenticate
from blade_runtime.serving.http.errors import MAX_HEADER_BYTES, STATUS, HttpError, status_of
from blade_runtime.serving.http.sites import Sites, TrustedSites, loopback

__all__ = [
    "DEFAULT_AUTH_THREADS",
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_HEADER_BYTES",
    "STATUS",
    "Authenticate",
    "HttpError",
    "HttpTransport",
    "RemoteRefused",
    "Sites",
    "TrustedSites",
    "create_app",
    "loopback",
    "status_of",
]
