"""The server's outermost layer: every request answered with an error status before it reached the engine (a bad
body, a missing key, a foreign Host, too large, no such path, a full queue) goes into the request list and the
log with its status and reason, so a user can see why their tool fails; and while the server shuts down, new
requests get 503 with Retry-After instead of being started.
"""

from __future__ import annotations

import json
from typing import Callable

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from macapp.server.activity import CURRENT_REQUEST, Activity
from macapp.server.errors import Flavor, error_response, flavor_for_path, shutting_down

MAX_REASON_BODY = 64 * 1024  # an error body is a few hundred bytes; anything longer is not read for its reason

Labeller = Callable[[Request, str], str]


def error_reason(body: bytes) -> str:
    """The message of an error body in either API's shape ("" when it is not one)."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return ""
    return str(error.get("message", "")) if isinstance(error, dict) else ""


class RefusalDesk:
    def __init__(self, app: ASGIApp, activity: Activity, label: Labeller):
        self.app = app
        self.activity = activity
        self.label = label

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.activity.stopping and scope["method"] == "POST":
            await error_response(shutting_down(), flavor_for_path(scope["path"]))(scope, receive, self._recording(scope, send))
            return
        token = CURRENT_REQUEST.set({})
        try:
            await self.app(scope, receive, self._recording(scope, send))
        finally:
            CURRENT_REQUEST.reset(token)

    def _recording(self, scope: Scope, send: Send) -> Send:
        status = 0
        body = b""
        current = CURRENT_REQUEST.get()

        async def recording(message: Message) -> None:
            nonlocal status, body
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and status >= 400 and not (current or {}).get("tracked"):
                if len(body) < MAX_REASON_BODY:
                    body += message.get("body", b"")
                if not message.get("more_body", False):  # listed before the client has the answer, not after
                    self._record(scope, status, error_reason(body[:MAX_REASON_BODY]))
            await send(message)

        return recording

    def _record(self, scope: Scope, status: int, reason: str) -> None:
        api = "anthropic" if flavor_for_path(scope["path"]) is Flavor.ANTHROPIC else "openai"
        self.activity.refused(self.label(Request(scope), api), api, status, reason or f"HTTP {status}")
