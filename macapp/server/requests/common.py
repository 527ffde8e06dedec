"""The base of every request model, the refusal a validator raises, and the field types the three APIs share.

Models are strict (a string is not a number, 1 is not true, 5.0 is an integer only through WHOLE) and ignore
fields they do not declare: agents send options a local model has no use for (reading.py logs them once).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from typing import Annotated, Callable, NoReturn

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, JsonValue, PlainValidator, Tag

from macapp.core.jsonvalue import JSONObject
from macapp.core.picture_data import ImagePart
from macapp.core.sampling import SamplingParams, preset
from macapp.server.errors import ApiError, invalid
from macapp.server.fields import MAX_DEPTH, check_structure

MAX_SEED = 2**64 - 1  # mx.random.seed takes an unsigned 64-bit integer
# A union's tags go into pydantic's error locations; marked so, reading.param_of leaves them out of the field name.
TAG_MARK = "~"
_TOKEN_ID = re.compile(r"[0-9]{1,10}")  # ASCII digits only ("²".isdigit() is true); 10 digits hold any vocab
_DATA_URL = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?:;[^,;]*)*;base64,(?P<data>.*)$", re.DOTALL)


class Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class Refusal(ValueError):
    """A validator's refusal. `template` names the field as {param}: where pydantic met the value ({at}), plus
    `suffix` (".type" for a part refused for its type), which is also the error's `param`."""

    def __init__(self, template: str, suffix: str = "") -> None:
        super().__init__(template)
        self.template = template
        self.suffix = suffix


UNSUPPORTED = "unsupported_kind:"  # + the field: a union given a kind it has no member for (reading.refusal_of)


def tag(name: str) -> Tag:
    """A union member's name (marked: see TAG_MARK)."""
    return Tag(TAG_MARK + name)


def kinds(refusal: str, field: str = "type", tag_of: Callable[[object], object] | None = None) -> Discriminator:
    """Chooses a union's member by `value[field]`, or by `tag_of(value)`: the member tagged with that name. Any
    other kind is refused with `refusal` ({param}: `field`'s name, {kind}: its value as sent); a value that is not
    an object, as not an object."""

    def chosen(value: object) -> str | None:
        name = tag_of(value) if tag_of is not None else value.get(field) if isinstance(value, dict) else None
        return TAG_MARK + name if isinstance(name, str) else None

    # No custom_error_context: a dict in it makes the annotation unhashable (`X | None` hashes it).
    return Discriminator(chosen, custom_error_type=UNSUPPORTED + field, custom_error_message=refusal)


def refuse(template: str, suffix: str = ".type") -> PlainValidator:
    """A union member that takes no value: `template` ({param}, {at}) says why."""

    def refusing(value: object) -> NoReturn:
        raise Refusal(template, suffix)

    return PlainValidator(refusing)


def _whole(value: object) -> object:
    return int(value) if isinstance(value, float) and value.is_integer() else value  # False for NaN and infinities


WHOLE = BeforeValidator(_whole)  # an integer: 5.0 too, as JSON writers may send it


def bounds(minimum: int | None = None, maximum: int | None = None) -> AfterValidator:
    """An integer from `minimum` to `maximum` (None: no bound)."""

    def in_range(value: int) -> int:
        if minimum is not None and value < minimum:
            raise Refusal(f"{{param}} must be at least {minimum}, not {value}.")
        if maximum is not None and value > maximum:
            raise Refusal(f"{{param}} must be at most {maximum}, not {value}.")
        return value

    return AfterValidator(in_range)


def within(low: float, high: float) -> PlainValidator:
    """A finite number (an integer too) from `low` to `high`, as a float."""

    def check(value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not math.isfinite(value)):
            raise Refusal("{param} must be a number.")
        if not low <= value <= high:
            raise Refusal(f"{{param}} must be between {low:g} and {high:g}, not {value}.")
        return float(value)

    return PlainValidator(check)


def string_or_parts(text_type: str, refusal: str) -> BeforeValidator:
    """A content field that takes a string (one part `{"type": text_type, "text": ...}`), null (no parts) or a
    list of parts (as sent, for the union to read); anything else is refused with `refusal` ({param})."""

    def as_parts(value: object) -> object:
        if value is None:
            return []
        if isinstance(value, str):
            return [{"type": text_type, "text": value}]
        if not isinstance(value, list):
            raise Refusal(refusal)
        return value

    return BeforeValidator(as_parts)


Seed = Annotated[int, WHOLE, bounds(0, MAX_SEED)]  # a sampling seed: what MLX's generator takes
Count = Annotated[int, WHOLE, bounds(1)]  # max_tokens and the like
Fraction = Annotated[float, within(0, 1)]  # top_p, min_p, Anthropic's temperature


def _stop(value: object) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value if value is not None else []
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise Refusal("{param} must be a string or an array of strings.")
    return tuple(s for s in items if s)


StopSequences = Annotated[tuple[str, ...], PlainValidator(_stop)]  # a string or strings (empty ones dropped); null: none


def _logit_bias(value: object) -> dict[int, float] | None:
    """Token id (a non-negative integer, as a string key) -> a finite bias in [-100, 100]. Ids beyond the
    vocabulary are the core's to refuse (sampling.check_logit_bias): only it knows the vocabulary."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise Refusal("{param} must be an object of token id -> bias.")
    out: dict[int, float] = {}
    for key, bias in value.items():
        if not _TOKEN_ID.fullmatch(key):
            raise Refusal(f"{{param}} keys are token ids (non-negative integers); {key!r} is not one.")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias) or not -100 <= bias <= 100:
            raise Refusal(f"{{param}} maps token ids to numbers between -100 and 100; {key!r}: {bias!r} is not that.")
        out[int(key)] = float(bias)
    return out or None


LogitBias = Annotated[dict[int, float] | None, PlainValidator(_logit_bias)]


def _arguments(value: object) -> JSONObject:
    """A call's arguments: a JSON string (OpenAI) or an object, always handed on as a mapping. A string's JSON is
    held to the body's own limits (nesting, lone surrogates): the template and the tokenizer read it too."""
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = json.loads(value)
            check_structure(value)
        except RecursionError:
            raise Refusal(f"{{param}} nests arrays and objects too deeply (more than {MAX_DEPTH} levels).") from None
        except ApiError as exc:
            raise Refusal(f"{{param}}, read as JSON: {exc.message}") from None
        except ValueError as exc:
            raise Refusal(f"{{param}} is not valid JSON: {exc}.") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Refusal("{param} must be a JSON object.")
    return value


# A JSON object passed on whole. Fields are typed with pydantic's JsonValue: pydantic cannot build a schema from
# jsonvalue's plain recursive alias (it recurses without end); to mypy the two are the same type.
JSONObjectField = dict[str, JsonValue]
Arguments = Annotated[JSONObjectField, PlainValidator(_arguments)]


def base64_image(data: str, media_type: str, suffix: str = "") -> ImagePart:
    try:
        return ImagePart(base64.b64decode(data, validate=True), media_type)
    except (binascii.Error, ValueError):
        raise Refusal("{param} is not valid base64 image data.", suffix) from None


def data_url_image(url: object, suffix: str = "") -> ImagePart:
    """An image given as a `data:` URL; remote URLs are refused (the server fetches nothing from the network)."""
    if not isinstance(url, str):
        raise Refusal("{param} must be a string URL.", suffix)
    match = _DATA_URL.match(url)
    if match is None:
        raise Refusal("{param}: only base64 data: URLs are supported (the server does not fetch images).", suffix)
    return base64_image(match["data"], match["type"] or "", suffix)


DataUrlImage = Annotated[ImagePart, PlainValidator(data_url_image)]


def data_url_video(url: object, suffix: str = "") -> ImagePart:
    """A video given as a base64 `data:video/...` URL; remote URLs are refused (the server fetches no media)."""
    if not isinstance(url, str):
        raise Refusal("{param} must be a string URL.", suffix)
    if re.match(r"^https?://", url.strip(), re.I):
        raise Refusal("{param}: remote video URLs are not fetched: send the video inline as a data: URL (data:video/mp4;base64,...).", suffix)
    match = _DATA_URL.match(url)
    if match is None or not (match["type"] or "").lower().startswith("video/"):
        raise Refusal("{param}: only base64 data: URLs of a video type are supported (data:video/mp4;base64,...).", suffix)
    try:
        return ImagePart(base64.b64decode(match["data"], validate=True), match["type"])
    except (binascii.Error, ValueError):
        raise Refusal("{param} is not valid base64 video data.", suffix) from None


def sampling_for(thinking: bool, max_tokens: int | None, **overrides: float | dict[int, float] | None) -> SamplingParams:
    """The model card's preset for the thinking mode, with the request's values over it (None: not given)."""
    try:
        params = preset(thinking, "general", max_tokens=max_tokens, **overrides)
        params.validate()
    except ValueError as exc:
        raise invalid(f"{exc}.") from exc
    return params
