"""Pictures in an API request (macapp.core.serving): decoded and checked, the tower run once, and the model view
that reads them, for the serving runner. Run on the engine's worker thread.

A request with pictures is read from an empty cache and never stored in the prompt-checkpoint pool: the pool
matches token prefixes, and every picture's placeholder tokens look the same whatever the picture.
"""

from __future__ import annotations

import dataclasses
import functools
import io
from pathlib import Path
from typing import Any, Sequence

from macapp.core.engine import EngineError
from macapp.core.serving.requests import INVALID_REQUEST, ImagePart
from macapp.core.vision import chat as vision_chat
from macapp.core.vision.dataurl import image_from_base64
from macapp.core.vision.cost import ProcessorLimits
from macapp.core.vision.images import DEFAULT_MAX_PIXELS, ImageError, PreparedImage


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


def extra_image_tokens(folder: Any, images: Sequence[ImagePart]) -> int:
    """How many tokens the pictures add to a rendered prompt (each placeholder widened to its image tokens), from
    the picture sizes and the folder's processor settings alone: no tower, no MLX (any thread)."""
    from PIL import Image

    processor = _image_processor(str(folder))
    extra = 0
    for n, part in enumerate(images):
        try:
            with Image.open(io.BytesIO(part.data)) as image:
                width, height = image.size
        except Exception:  # noqa: BLE001 - what Pillow raises for bad bytes varies; the request is refused by name
            raise EngineError(f"image {n + 1}: is not a picture Qwen Desk can read", INVALID_REQUEST) from None
        extra += processor.num_image_tokens(height, width) - 1
    return extra


@functools.lru_cache(maxsize=4)
def _image_processor(folder: str) -> Any:
    from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLImageProcessor

    limits = ProcessorLimits.from_files(Path(folder))
    return Qwen3VLImageProcessor(
        patch_size=limits.patch_size, merge_size=limits.merge_size, temporal_patch_size=limits.temporal_patch_size,
        min_pixels=limits.min_pixels, max_pixels=min(limits.max_pixels, DEFAULT_MAX_PIXELS),
    )


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
