"""A request body as a JSON object, held to the limits every API shares before its model reads it
(macapp.server.requests): finite numbers, nesting of at most MAX_DEPTH levels, no lone UTF-16 surrogate; and the
log of the top-level fields a server accepts and does not use."""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Iterable, Mapping, NoReturn

from macapp.core.jsonvalue import JSONObject
from macapp.server.errors import invalid

log = logging.getLogger(__name__)
_NOTED_MAX = 256  # ignored field names remembered for the log (a client sending random keys cannot grow it)
_noted: set[tuple[str, str]] = set()
MAX_DEPTH = 128  # nesting of arrays and objects; real agents' bodies (tool schemas included) stay under ~30
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")  # only a \uD800-\uDFFF escape makes one


def parse_json_object(raw: bytes) -> JSONObject:
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


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range for a number")
    return value


def check_structure(body: object, surrogates: bool = True) -> None:
    """Refuse nesting deeper than MAX_DEPTH (the template, the tool parser and json.dumps recurse) and, when
    `surrogates`, a lone UTF-16 surrogate in any string (no tokenizer can encode one), naming where it is."""
    stack: list[tuple[object, int, str]] = [(body, 0, "")]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, dict):
            items: Iterable[tuple[object, object]] = value.items()
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


def note_ignored(body: Mapping[str, object], used: frozenset[str], api: str) -> list[str]:
    """Log, once per name, the top-level fields of `body` this server does not use (they are accepted, not refused:
    agents send options a local model has no use for, such as Claude Code's `context_management`); returns the
    names logged now."""
    new = [k for k in body if k not in used and (api, k) not in _noted]
    for key in new[: max(0, _NOTED_MAX - len(_noted))]:
        _noted.add((api, key))
        log.info("%s requests: field %r is accepted and ignored (this server does not use it)", api, key)
    return new
