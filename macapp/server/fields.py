"""Typed readers for the fields of a JSON request body, shared by both APIs: each refuses a wrong type or range
with a 400 naming the field (`param`), the way the real APIs answer, instead of a framework's 422."""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import re
from typing import Any

from macapp.core.sampling import SamplingParams, preset
from macapp.core.serving.requests import ImagePart
from macapp.server.errors import invalid

log = logging.getLogger(__name__)
_MISSING = object()
_NOTED_MAX = 256  # ignored field names remembered for the log (a client sending random keys cannot grow it)
_noted: set[tuple[str, str]] = set()
MAX_DEPTH = 128  # nesting of arrays and objects; real agents' bodies (tool schemas included) stay under ~30
MAX_SEED = 2**64 - 1  # mx.random.seed takes an unsigned 64-bit integer
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")  # only a \uD800-\uDFFF escape makes one
_TOKEN_ID = re.compile(r"[0-9]{1,10}")  # ASCII digits only ("²".isdigit() is true); 10 digits hold any vocab
_DATA_URL = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?:;[^,;]*)*;base64,(?P<data>.*)$", re.DOTALL)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying what is wrong with it."""
    if not raw.strip():
        raise invalid("The request body is empty: send a JSON object.")
    try:
        body = json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise invalid(f"The request body nests arrays and objects too deeply (more than {MAX_DEPTH} levels).") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid(f"The request body is not valid JSON: {exc}.") from exc
    if not isinstance(body, dict):
        raise invalid(f"The request body must be a JSON object, not {type(body).__name__}.")
    check_structure(body, surrogates=_ESCAPED_SURROGATE.search(raw) is not None)
    return body


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range for a number")
    return value


def check_structure(body: Any, surrogates: bool = True) -> None:
    """Refuse nesting deeper than MAX_DEPTH (the template, the tool parser and json.dumps recurse) and, when
    `surrogates`, a lone UTF-16 surrogate in any string (no tokenizer can encode one), naming where it is."""
    stack: list[tuple[Any, int, str]] = [(body, 0, "")]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, dict):
            items: Any = value.items()
        elif isinstance(value, list):
            items = enumerate(value)
        else:
            if surrogates and isinstance(value, str) and not _encodable(value):
                raise invalid(f"{where or 'the body'} holds a lone UTF-16 surrogate, which is not text: send valid Unicode.", param=where or None)
            continue
        if depth >= MAX_DEPTH:
            raise invalid(f"The request body nests arrays and objects too deeply (more than {MAX_DEPTH} levels).", param=where or None)
        for key, item in items:
            if surrogates and isinstance(key, str) and not _encodable(key):
                raise invalid(f"A key in {where or 'the body'} holds a lone UTF-16 surrogate: send valid Unicode.", param=where or None)
            if isinstance(item, (dict, list)) or (surrogates and isinstance(item, str)):
                stack.append((item, depth + 1, f"{where}[{key}]" if isinstance(key, int) else (f"{where}.{key}" if where else str(key))))


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def note_ignored(body: dict, used: frozenset[str], api: str) -> list[str]:
    """Log, once per name, the top-level fields of `body` this server does not use (they are accepted, not refused:
    agents send options a local model has no use for, such as Claude Code's `context_management`); returns the
    names logged now."""
    new = [k for k in body if k not in used and (api, k) not in _noted]
    for key in new[: max(0, _NOTED_MAX - len(_noted))]:
        _noted.add((api, key))
        log.info("%s requests: field %r is accepted and ignored (this server does not use it)", api, key)
    return new


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


def get_int(obj: dict, key: str, param: str, minimum: int | None = None, default: Any = None, maximum: int | None = None) -> Any:
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not value.is_integer()):
        raise invalid(f"{param} must be an integer.", param=param)  # is_integer is False for NaN and infinities
    value = int(value)
    if minimum is not None and value < minimum:
        raise invalid(f"{param} must be at least {minimum}, not {value}.", param=param)
    if maximum is not None and value > maximum:
        raise invalid(f"{param} must be at most {maximum}, not {value}.", param=param)
    return value


def get_seed(obj: dict, key: str = "seed", param: str = "seed") -> int | None:
    """A sampling seed: an integer from 0 to 2**64 - 1 (what MLX's generator takes)."""
    return get_int(obj, key, param, minimum=0, maximum=MAX_SEED)


def get_float(obj: dict, key: str, param: str, low: float, high: float, default: Any = None) -> Any:
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
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
    """OpenAI's `logit_bias`: token id (a non-negative integer, as a string key) -> a finite bias in [-100, 100].
    Ids beyond the vocabulary are the core's to refuse (sampling.check_logit_bias): only it knows the vocabulary."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(f"{param} must be an object of token id -> bias.", param=param)
    out = {}
    for key, bias in value.items():
        if not _TOKEN_ID.fullmatch(key):
            raise invalid(f"{param} keys are token ids (non-negative integers); {key!r} is not one.", param=param)
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias) or not -100 <= bias <= 100:
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
