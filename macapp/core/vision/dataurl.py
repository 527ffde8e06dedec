"""Pictures that arrive over the API: OpenAI ``image_url`` parts with ``data:`` URLs, Anthropic base64 sources.

Remote ``http(s)`` URLs are refused: the app fetches nothing on a request's behalf (a page could otherwise make
it reach into the local network). Every problem is an `ImageError` naming the part, for a 400 reply.
"""

from __future__ import annotations

import base64
import binascii
import re

from macapp.core.vision.images import DEFAULT_MAX_PIXELS, ImageError, PreparedImage, image_from_bytes

MEDIA_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp", "image/bmp", "image/tiff")
MAX_ENCODED_BYTES = 30_000_000  # one picture's base64 text; a request's body limit is the server's
_DATA_URL = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[^;,]*)*)(?P<b64>;base64)?,(?P<data>.*)$", re.S)


class RemoteImageRefused(ImageError):
    """An http(s) image URL: not fetched."""


def image_from_url(url: str, name: str = "image_url", max_pixels: int = DEFAULT_MAX_PIXELS) -> PreparedImage:
    """An OpenAI-style image URL → PreparedImage: only ``data:`` URLs are read."""
    url = (url or "").strip()
    if re.match(r"^https?://", url, re.I):
        raise RemoteImageRefused(name, "remote image URLs are not fetched: send the picture inline as a data: URL (data:image/png;base64,...)")
    if not url.lower().startswith("data:"):
        raise ImageError(name, "must be a data: URL (data:image/png;base64,...)")
    return image_from_data_url(url, name, max_pixels)


def image_from_data_url(url: str, name: str = "image_url", max_pixels: int = DEFAULT_MAX_PIXELS) -> PreparedImage:
    match = _DATA_URL.match(url.strip())
    if not match:
        raise ImageError(name, "is not a valid data: URL (expected data:image/png;base64,...)")
    media_type = (match.group("type") or "").lower()
    if not match.group("b64"):
        raise ImageError(name, "data: URL must be base64-encoded (;base64,)")
    return image_from_base64(match.group("data"), media_type, name, max_pixels)


def image_from_base64(data: str, media_type: str, name: str = "image", max_pixels: int = DEFAULT_MAX_PIXELS) -> PreparedImage:
    """An Anthropic-style base64 source (or a data URL's payload) → PreparedImage."""
    media_type = (media_type or "").lower()
    if not media_type.startswith("image/"):  # the bytes decide which picture format it is (Pillow reads the header)
        raise ImageError(name, f"media type {media_type or 'missing'!s} is not a picture type ({', '.join(MEDIA_TYPES)})")
    if not isinstance(data, str) or not data:
        raise ImageError(name, "has no image data")
    if len(data) > MAX_ENCODED_BYTES:
        raise ImageError(name, f"is too large ({len(data):,} characters of base64; at most {MAX_ENCODED_BYTES:,})")
    try:
        raw = base64.b64decode(re.sub(r"\s+", "", data), validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(name, "is not valid base64") from None
    return image_from_bytes(raw, name, max_pixels)
