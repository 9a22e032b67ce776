"""Which sites a served surface answers: the ``Host`` it is reached by, the browser ``Origin`` a
request comes from, and the JSON that every state-changing request must declare.

A page of another site must not drive the server through a person's browser. Two ways exist,
and both are refused here, before authentication or any route runs:

- **DNS rebinding**: a name the attacker controls resolves to 127.0.0.1 once their page has
  loaded, so the page is same-origin with a local server and reads and writes as it likes. Its
  requests carry the attacker's name as ``Host``: only the loopback names and those the operator
  names are answered (``421 HOST_NOT_ALLOWED``), as Django's ``ALLOWED_HOSTS``, Starlette's
  ``TrustedHostMiddleware`` and the MCP SDK's transport security do.
- **Cross-site requests** (CSRF): a form or a ``fetch`` of another site's page, sent with the
  person's cookies. A browser says where it comes from in ``Origin``: a request from another
  origin than the server's own (the ``Host`` it was sent to) and those the operator names is
  refused (``403 ORIGIN_NOT_ALLOWED``), whatever the method. A POST, PUT or PATCH must also
  declare a JSON body (``415 UNSUPPORTED_MEDIA_TYPE`` otherwise, an empty body included): no
  HTML form can, and a script of another origin cannot without a CORS preflight this server
  never grants. DELETE is never a form's method either, and preflighted the same way.

Requests without ``Origin`` (curl, httpx, other servers) are not a browser's cross-site ones:
only their ``Host`` is checked.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from blade_runtime.serving.http.errors import HttpError, status_of

BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})


def loopback(host: str | None) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this machine."""
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _split_authority(authority: str) -> tuple[str, str | None]:
    """``host[:port]`` as (lower-case host without a trailing dot, port or None); an IPv6
    address keeps its brackets."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        end = authority.find("]")
        host, rest = authority[: end + 1], authority[end + 1 :]
        port = rest[1:] if rest.startswith(":") else None
    else:
        host, _, port_text = authority.partition(":")
        port = port_text if port_text else None
    return host.rstrip("."), port


@dataclass(frozen=True, slots=True)
class Sites:
    """The hosts and origins a surface answers besides its own loopback names and origin.

    ``hosts``: names (``tools.example.com``, any port), names with a port
    (``tools.example.com:8443``), ``*.example.com`` (its subdomains) or ``*`` (any: for a
    server behind a proxy that checks ``Host`` itself). ``origins``: browser origins
    (``https://app.example.com``) whose pages may send requests, besides the server's own."""

    hosts: tuple[str, ...] = ()
    origins: tuple[str, ...] = ()

    @classmethod
    def of(cls, hosts: Iterable[str] = (), origins: Iterable[str] = ()) -> Sites:
        """Checked: ``ValueError`` naming the entry that is not a host or an origin."""
        host_list = tuple(h.strip().lower() for h in hosts)
        for host in host_list:
            name, port = _split_authority(host.removeprefix("*."))
            malformed = "/" in host or "@" in host or (port is not None and not port.isdigit())
            if malformed or (not name and host != "*"):
                raise ValueError(
                    f"allowed host {host!r} is a name or an address, with an "
                    "optional :PORT (tools.example.com, *.example.com, or *)"
                )
        origin_list = tuple(o.strip().lower().rstrip("/") for o in origins)
        for origin in origin_list:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
                raise ValueError(
                    f"allowed origin {origin!r} is SCHEME://HOST[:PORT], "
                    "e.g. https://app.example.com"
                )
        return cls(host_list, origin_list)

    def host_allowed(self, authority: str) -> bool:
        host, port = _split_authority(authority)
        if not host:
            return False
        if loopback(host):
            return True
        for allowed in self.hosts:
            if allowed == "*":
                return True
            if allowed.startswith("*."):
                if host.endswith(allowed[1:]) and host != allowed[2:]:
                    return True
                continue
            name, wanted = _split_authority(allowed)
            if name == host and wanted in (None, port):
                return True
        return False

    def origin_allowed(self, origin: str, authority: str) -> bool:
        """A browser's ``Origin``: the server's own (the authority it sent the request to, as
        ``Host`` says; the scheme is not compared, since a TLS proxy in front speaks http to
        us) or one the operator named."""
        origin = origin.strip().lower()
        if origin in self.origins:
            return True
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False  # "null" (a sandboxed frame, a file) or garbage
        return _split_authority(parts.netloc) == _split_authority(authority)


class TrustedSites:
    """ASGI middleware: the checks of the module's doc, before the app sees the request."""

    def __init__(self, app: ASGIApp, sites: Sites) -> None:
        self.app = app
        self.sites = sites

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the lifespan (no route here speaks websocket)
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        code, message = refusal
        status = status_of(code)
        body = json.dumps({"code": code.value, "message": message}, separators=(",", ":")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def refusal(self, scope: Scope) -> tuple[HttpError, str] | None:
        host = origin = kind = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
            elif name == b"content-type":
                kind = value.decode("latin-1")
        if host is None or not self.sites.host_allowed(host):
            shown = "no Host" if host is None else f"the host {_shown(host)}"
            return (
                HttpError.HOST_NOT_ALLOWED,
                f"This server does not answer {shown}: name it among the allowed hosts "
                "(--allowed-host, allowed_hosts=) if it is this server's.",
            )
        if origin is not None and not self.sites.origin_allowed(origin, host):
            return (
                HttpError.ORIGIN_NOT_ALLOWED,
                f"Requests from pages of {_shown(origin)} are refused: name the origin among "
                "the allowed origins (--allowed-origin, allowed_origins=) if it is yours.",
            )
        if scope.get("method") in BODY_METHODS and not json_media_type(kind):
            declared = "undeclared" if not kind else _shown(kind.split(";")[0].strip())
            return (
                HttpError.UNSUPPORTED_MEDIA_TYPE,
                f"The body must be declared Content-Type: application/json, not {declared}.",
            )
        return None


def json_media_type(kind: str | None) -> bool:
    media = (kind or "").split(";")[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _shown(text: str) -> str:
    """A header's value in a message: quoted, cut, on one line."""
    cut = text if len(text) <= 100 else text[:99] + "…"
    return repr(" ".join(cut.split()))
