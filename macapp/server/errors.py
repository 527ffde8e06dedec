"""Errors as each API spells them: OpenAI's `{"error": {...}}` and Anthropic's `{"type": "error", "error": {...}}`.

Every refusal of the server (bad body, bad key, foreign Host, too large, unknown path, queue full) is an
`ApiError`; which shape it goes out in depends only on the path (`flavor_for_path`), so the security layer and
the routes answer alike.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from starlette.responses import JSONResponse


class Flavor(enum.Enum):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"


class ErrorKind(enum.Enum):
    INVALID_REQUEST = 400
    AUTHENTICATION = 401
    PERMISSION = 403
    NOT_FOUND = 404
    METHOD_NOT_ALLOWED = 405
    TOO_LARGE = 413
    RATE_LIMIT = 429
    SERVER = 500
    OVERLOADED = 503


# The `type` each API uses for a kind (Anthropic: docs.anthropic.com/en/api/errors; OpenAI: its error objects).
_OPENAI_TYPES = {
    ErrorKind.INVALID_REQUEST: "invalid_request_error",
    ErrorKind.AUTHENTICATION: "authentication_error",
    ErrorKind.PERMISSION: "permission_error",
    ErrorKind.NOT_FOUND: "not_found_error",
    ErrorKind.METHOD_NOT_ALLOWED: "invalid_request_error",
    ErrorKind.TOO_LARGE: "invalid_request_error",
    ErrorKind.RATE_LIMIT: "rate_limit_error",
    ErrorKind.SERVER: "server_error",
    ErrorKind.OVERLOADED: "server_error",
}
_ANTHROPIC_TYPES = {
    ErrorKind.INVALID_REQUEST: "invalid_request_error",
    ErrorKind.AUTHENTICATION: "authentication_error",
    ErrorKind.PERMISSION: "permission_error",
    ErrorKind.NOT_FOUND: "not_found_error",
    ErrorKind.METHOD_NOT_ALLOWED: "invalid_request_error",
    ErrorKind.TOO_LARGE: "request_too_large",
    ErrorKind.RATE_LIMIT: "rate_limit_error",
    ErrorKind.SERVER: "api_error",
    ErrorKind.OVERLOADED: "overloaded_error",
}


@dataclass
class ApiError(Exception):
    kind: ErrorKind
    message: str
    param: str | None = None  # OpenAI's `param`: the field at fault, e.g. "messages[2].role"
    code: str | None = None  # OpenAI's `code`, e.g. "context_length_exceeded", "invalid_api_key"
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    @property
    def status(self) -> int:
        return self.kind.value


def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400 for a bad request body."""
    return ApiError(ErrorKind.INVALID_REQUEST, message, param=param, code=code)


RETRY_AFTER_RESTART_S = 5  # what a client is told to wait when the server is going down (it may come back)


def shutting_down(cut: bool = False) -> ApiError:
    """The 503 for a request the server will not finish because it is stopping; `cut`: a reply already begun."""
    what = "this reply was cut short and is not complete" if cut else "this request was not answered"
    return ApiError(
        ErrorKind.OVERLOADED,
        f"The server is shutting down: {what}. Send it again once the server is back.",
        code="server_shutting_down",
        headers={"Retry-After": str(RETRY_AFTER_RESTART_S)},
    )


def flavor_for_path(path: str) -> Flavor:
    return Flavor.ANTHROPIC if path.startswith("/v1/messages") else Flavor.OPENAI


def error_body(error: ApiError, flavor: Flavor) -> dict[str, object]:
    if flavor is Flavor.ANTHROPIC:
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES[error.kind], "message": error.message}}
    return {"error": {"message": error.message, "type": _OPENAI_TYPES[error.kind], "param": error.param, "code": error.code}}


def error_response(error: ApiError, flavor: Flavor) -> JSONResponse:
    return JSONResponse(error_body(error, flavor), status_code=error.status, headers=error.headers)
