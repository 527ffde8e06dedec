"""A request body -> its model, or a 400 (`ApiError`) naming the first field at fault the way the real APIs do
(`param`: "messages[2].content[0].text"), instead of a framework's 422 and its list of pydantic errors."""

from __future__ import annotations

from typing import TypeVar

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from macapp.core.jsonvalue import JSONObject
from macapp.server.errors import ApiError, invalid
from macapp.server.fields import note_ignored
from macapp.server.requests.common import TAG_MARK, UNSUPPORTED, Model, Refusal

M = TypeVar("M", bound=Model)

# What a value of the wrong JSON type is told, by pydantic's error type.
_WRONG_TYPE = {
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "finite_number": "must be a number",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "list_type": "must be an array",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
}


def read(model: type[M], body: JSONObject, api: str) -> M:
    """`body` as `model`; the top-level fields the model does not declare are accepted and logged once."""
    note_ignored(body, frozenset(model.model_fields), api)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise refusal_of(exc.errors(include_url=False)[0]) from None


def refusal_of(error: ErrorDetails) -> ApiError:
    param = param_of(error["loc"])
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, Refusal):
        return _refused(cause.template, param, cause.suffix)
    if error["type"].startswith(UNSUPPORTED):
        return _unsupported(error, param)
    return invalid(_message(error, param or "The body"), param=param or None)


def _refused(template: str, at: str, suffix: str = "") -> ApiError:
    param = at + suffix
    return invalid(template.replace("{at}", at or "The body").replace("{param}", param or "The body"), param=param or None)


def _unsupported(error: ErrorDetails, at: str) -> ApiError:
    """A union given a kind it has no member for (common.kinds): its refusal names the kind."""
    value, field = error.get("input"), error["type"].removeprefix(UNSUPPORTED)
    if not isinstance(value, dict):
        return _refused("{param} must be an object.", at)
    return _refused(error["msg"].replace("{kind}", repr(value.get(field))), at, f".{field}")


def param_of(loc: tuple[int | str, ...]) -> str:
    """('messages', 2, '~user', 'content', 0) -> 'messages[2].content[0]' (a union's tags left out)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not part.startswith(TAG_MARK):
            out = f"{out}.{part}" if out else part
    return out


def _message(error: ErrorDetails, param: str) -> str:
    kind, value = error["type"], error.get("input")
    if kind == "missing" or (kind in _WRONG_TYPE and value is None):
        return f"{param} is required."
    if kind in _WRONG_TYPE:
        return f"{param} {_WRONG_TYPE[kind]}."
    if kind == "literal_error":
        return f"{param} {value!r} is not {(error.get('ctx') or {}).get('expected')}."
    return f"{param}: {error['msg']}."
