"""Typed readers for the fields of a JSON request body, shared by both APIs: each refuses a wrong type or range
with a 400 naming the field (`param`), the way the real APIs answer, instead of a framework's 422."""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from macapp.core.sampling import SamplingParams, preset
from macapp.core.serving.requests import ImagePart
from macapp.server.errors import invalid

_MISSING = object()
_DATA_URL = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?:;[^,;]*)*;base64,(?P<data>.*)$", re.DOTALL)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying what is wrong with it."""
    if not raw.strip():
        raise invalid("The request body is empty: send a JSON object.")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid(f"The request body is not valid JSON: {exc}.") from exc
    if not isinstance(body, dict):
        raise invalid(f"The request body must be a JSON object, not {type(body).__name__}.")
    return body


def get_str(obj: dict, key: str, param: str, default: Any = None, required: bool = False) -> Any:
    value = obj.get(key, _MISSING)
    if value is _MISSING or value is None:
        if required:
            raise invalid(f"{param} is required.", param=param)
        return default
    if not isinstance(value, str):
        raise invalid(f"{param} must be a string.", param=param)
    return value


def get_bool(obj: dict, key: str, param: str, default: Any = None) -> Any:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"{param} must be true or false.", param=param)
    return value


def get_int(obj: dict, key: str, param: str, minimum: int | None = None, default: Any = None) -> Any:
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise invalid(f"{param} must be an integer.", param=param)
    value = int(value)
    if minimum is not None and value < minimum:
        raise invalid(f"{param} must be at least {minimum}, not {value}.", param=param)
    return value


def get_float(obj: dict, key: str, param: str, low: float, high: float, default: Any = None) -> Any:
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(f"{param} must be a number.", param=param)
    if not low <= value <= high:
        raise invalid(f"{param} must be between {low:g} and {high:g}, not {value}.", param=param)
    return float(value)


def get_list(obj: dict, key: str, param: str, required: bool = False) -> list:
    value = obj.get(key)
    if value is None:
        if required:
            raise invalid(f"{param} is required.", param=param)
        return []
    if not isinstance(value, list):
        raise invalid(f"{param} must be an array.", param=param)
    return value


def get_object(obj: dict, key: str, param: str) -> dict:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(f"{param} must be an object.", param=param)
    return value


def require_object(value: Any, param: str) -> dict:
    if not isinstance(value, dict):
        raise invalid(f"{param} must be an object.", param=param)
    return value


def stop_sequences(value: Any, param: str) -> tuple[str, ...]:
    """`stop` / `stop_sequences`: a string or a list of strings (empty ones dropped)."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise invalid(f"{param} must be a string or an array of strings.", param=param)
    return tuple(s for s in items if s)


def logit_bias(value: Any, param: str = "logit_bias") -> dict[int, float] | None:
    """OpenAI's `logit_bias`: token id (as a string key) -> bias in [-100, 100]."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(f"{param} must be an object of token id -> bias.", param=param)
    out = {}
    for key, bias in value.items():
        if not str(key).isdigit() or isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise invalid(f"{param} maps token ids to numbers between -100 and 100; {key!r}: {bias!r} is not that.", param=param)
        out[int(key)] = float(bias)
    return out or None


def decode_image(data: str, media_type: str, param: str) -> ImagePart:
    try:
        return ImagePart(base64.b64decode(data, validate=True), media_type)
    except (binascii.Error, ValueError) as exc:
        raise invalid(f"{param} is not valid base64 image data.", param=param) from exc


def image_from_url(url: Any, param: str) -> ImagePart:
    """An image given as a `data:` URL; remote URLs are refused (the server fetches nothing from the network)."""
    if not isinstance(url, str):
        raise invalid(f"{param} must be a string URL.", param=param)
    match = _DATA_URL.match(url)
    if match is None:
        raise invalid(f"{param}: only base64 data: URLs are supported (the server does not fetch images).", param=param)
    return decode_image(match["data"], match["type"] or "", param)


def sampling_for(thinking: bool, max_tokens: int | None, **overrides: Any) -> SamplingParams:
    """The model card's preset for the thinking mode, with the request's values over it (None: not given)."""
    try:
        params = preset(thinking, max_tokens=max_tokens, **overrides)
        params.validate()
    except ValueError as exc:
        raise invalid(f"{exc}.") from exc
    return params


def tool_arguments(value: Any, param: str) -> dict[str, Any]:
    """A call's arguments: a JSON string (OpenAI) or an object, always handed on as a mapping."""
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise invalid(f"{param} is not valid JSON: {exc}.", param=param) from exc
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(f"{param} must be a JSON object.", param=param)
    return value
