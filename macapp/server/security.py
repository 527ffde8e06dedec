"""The server's front door, as pure ASGI middleware (no buffering, so streams and disconnects pass through).

In this order: a `Host` that is not a name of this server is refused (a web page using DNS rebinding names its
own host, and that works against a server bound to the LAN too): loopback names always, this machine's own
names and addresses when bound beyond loopback, and the names given with --allow-host; a browser `Origin` that is not configured is refused (no
permissive CORS: a page in the user's browser must not drive the model); the API key, when set, must come as
`Authorization: Bearer KEY` or `x-api-key: KEY` (constant-time comparison); a body over the size limit gets 413,
whether it says its length up front or streams it. Refusals use the API's own error shape.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from macapp.server.config import MAX_BODY_BYTES, ServerConfig, is_loopback, machine_names, normal_host
from macapp.server.errors import ApiError, ErrorKind, error_response, flavor_for_path


@dataclass(frozen=True)
class SecurityPolicy:
    api_key: str | None = None
    allowed_hosts: frozenset[str] = frozenset()  # Host names accepted besides loopback ones; "*": any
    allowed_origins: tuple[str, ...] = ()
    max_body_bytes: int = MAX_BODY_BYTES
    loopback: bool = True  # bound to loopback (only says so in the refusal)

    @classmethod
    def from_config(cls, config: ServerConfig) -> "SecurityPolicy":
        hosts = {normal_host(h) for h in config.allowed_hosts}
        if not config.loopback:
            hosts |= machine_names() | {normal_host(config.host)}
        hosts -= {"", "0.0.0.0", "::"}
        return cls(config.api_key or None, frozenset(hosts), tuple(config.allowed_origins), config.max_body_bytes, config.loopback)

    def host_allowed(self, name: str) -> bool:
        return is_loopback(name) or "*" in self.allowed_hosts or normal_host(name) in self.allowed_hosts


def host_name(host_header: str) -> str:
    """The name in a Host header: 'localhost:8642' -> 'localhost', '[::1]:8642' -> '::1'."""
    host = host_header.strip()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def presented_key(headers: Headers) -> str | None:
    auth = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get("x-api-key") or None


def key_matches(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def check_request(policy: SecurityPolicy, path: str, method: str, headers: Headers) -> ApiError | None:
    """Why this request must be refused before it reaches a route, or None."""
    host = headers.get("host", "")
    if not policy.host_allowed(host_name(host)):
        where = (
            "only http://127.0.0.1 or http://localhost while it is bound to this machine"
            if policy.loopback
            else "its loopback names and this machine's own names and addresses"
        )
        return ApiError(
            ErrorKind.PERMISSION,
            f"Host {host or '(none)'!r} is not a name of this server; it answers {where}. If {host_name(host) or 'it'!s} "
            f"is yours (a proxy, a DNS name), start the server with --allow-host {host_name(host) or 'NAME'}.",
        )
    origin = headers.get("origin")
    if origin is not None and origin not in policy.allowed_origins:
        return ApiError(
            ErrorKind.PERMISSION,
            f"Requests from web pages ({origin}) are not allowed; start the server with --allow-origin {origin} to allow it.",
        )
    is_preflight = method == "OPTIONS" and origin is not None
    # Claude Code warms its connection with a keyless `HEAD /`: a body-less 200 tells no more than the 401 would.
    is_warm_up = method == "HEAD" and path == "/"
    if policy.api_key and not (is_preflight or is_warm_up):  # every other path, /health included: the contract
        if not key_matches(presented_key(headers), policy.api_key):
            return ApiError(
                ErrorKind.AUTHENTICATION,
                "Invalid or missing API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'.",
                code="invalid_api_key",
            )
    length = headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > policy.max_body_bytes:
        return too_large(policy.max_body_bytes)
    return None


def too_large(limit: int) -> ApiError:
    return ApiError(ErrorKind.TOO_LARGE, f"The request body is over this server's limit of {limit // (1024 * 1024)} MB.")


class Guard:
    """ASGI middleware applying a SecurityPolicy in front of `app` (CORS headers only for configured origins)."""

    def __init__(self, app: ASGIApp, policy: SecurityPolicy):
        self.policy = policy
        if policy.allowed_origins:
            app = CORSMiddleware(
                app,
                allow_origins=list(policy.allowed_origins),
                allow_methods=["GET", "POST", "OPTIONS"],
                allow_headers=["*"],
                expose_headers=["Retry-After"],
            )
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        error = check_request(self.policy, scope["path"], scope["method"], Headers(scope=scope))
        if error is not None:
            await error_response(error, flavor_for_path(scope["path"]))(scope, receive, send)
            return
        await self.app(scope, self._limited(receive), send)

    def _limited(self, receive: Receive) -> Receive:
        """`receive` that raises a 413 ApiError once the body passes the limit (a chunked body has no length)."""
        seen = 0
        limit = self.policy.max_body_bytes

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise too_large(limit)
            return message

        return limited
