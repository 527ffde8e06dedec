"""Pictures in an API request (macapp.core.serving): decoded and checked, the tower run once, and the model view
that reads them, for the serving runner. Run on the engine's worker thread.

A request with pictures is read from an empty cache and never stored in the prompt-checkpoint pool: the pool
matches token prefixes, and every picture's placeholder tokens look the same whatever the picture.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from macapp.core.engine import EngineError
from macapp.core.serving.requests import INVALID_REQUEST, ImagePart
from macapp.core.vision import chat as vision_chat
from macapp.core.vision.dataurl import image_from_base64
from macapp.core.vision.images import ImageError, PreparedImage


@dataclasses.dataclass
class PictureRequest:
    model: Any  # the LoadedModel view whose `model` reads pictures (vision.runner.PositionedLM)
    tokens: list[int]  # the prompt with each placeholder widened to its picture's image tokens
    encoded: Any  # vision.runner.EncodedTurn (embeddings, positions, image_tokens)
    cache: list  # the empty mlx-lm prompt cache the prompt is read into


def decode_pictures(images: Sequence[ImagePart]) -> list[PreparedImage]:
    """The request's image bytes as checked pictures; EngineError(INVALID_REQUEST) naming the bad one."""
    import base64

    out = []
    for n, part in enumerate(images):
        try:
            out.append(image_from_base64(base64.b64encode(part.data).decode(), part.media_type or "image/png", f"image {n + 1}"))
        except ImageError as exc:
            raise EngineError(str(exc), INVALID_REQUEST) from None
    return out


def prepare(m: Any, tokens: list[int], images: Sequence[ImagePart], limit: int) -> PictureRequest:
    """Everything a request with pictures needs before its prompt is read (into the PictureRequest's fresh cache)."""
    from mlx_lm.models.cache import make_prompt_cache

    pictures = decode_pictures(images)
    try:
        vision = vision_chat.vision_for(m)
        vision_chat.check_room(vision, pictures, len(tokens), limit - 1)
    except EngineError as exc:
        raise EngineError(exc.message, INVALID_REQUEST) from exc  # the request cannot be served as sent: a 400
    encoded = vision.encode(tokens, pictures)
    cache = make_prompt_cache(m.model)
    vision.lm.bind([])
    vision.lm.queue(encoded, cache)
    return PictureRequest(dataclasses.replace(m, model=vision.lm), encoded.tokens, encoded, cache)
