"""Pictures in an API request (macapp.core.serving): decoded and checked, laid out in the prompt, the tower run
on those not read yet, and the model view that reads them, for the serving runner. Run on the engine's worker thread.

Prompt reuse (the runner's checkpoint pool): `prepare` widens each picture's placeholder to its image tokens
(counted from its size by the processor's own sizing, no pixels processed) and keys those tokens by the
picture's content digest, so the pool's longest-prefix match counts a prefix only with the same pictures in the
same places. `begin` then goes on from the checkpoint found (its cache keeps the pictures it read, with their
positions): the tower runs only on the pictures after it, and their mRoPE positions continue from the
checkpoint's, as a chat session's later turns do. A follow-up question about the same picture thus reads only its new tail.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from macapp.core import events as ev
from macapp.core.engine import EngineError
from macapp.core.engine import pictures as engine_pictures
from macapp.core.engine.prompt_cache import PromptCache
from macapp.core.picture_data import ImagePart
from macapp.core.serving.render import boundaries
from macapp.core.serving.requests import INVALID_REQUEST
from macapp.core.vision.dataurl import image_from_base64
from macapp.core.fit.picture_cost import ProcessorLimits
from macapp.core.vision.images import DEFAULT_MAX_PIXELS, ImageError, PreparedImage
from macapp.core.vision.mlx_frames import video_processor
from macapp.core.vision.video import PreparedVideo, VideoError, VideoSettings, open_video, plan, probe

if TYPE_CHECKING:  # vision.runner imports MLX
    from macapp.core.engine.positions import Key
    from macapp.core.engine.model_folder import LoadedModel
    from macapp.core.vision.runner import EncodedTurn, VisionModel
    from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLImageProcessor


@dataclasses.dataclass
class PictureRequest:
    """A prompt with pictures laid out, before the tower runs."""

    vision: VisionModel
    model: LoadedModel  # the view whose `model` reads pictures (vision.runner.PositionedLM)
    tokens: list[int]  # the prompt with each placeholder widened to its picture's image tokens
    key: Key  # the checkpoint pool's key of `tokens`: each picture's image tokens are its digest
    boundaries: tuple[int, ...]  # the rendered prompt's checkpoint boundaries, as offsets into `tokens`
    pictures: list[PreparedImage]  # each slot's picture (a video once per pair of its frames)
    starts: list[int]  # each slot's first image token in `tokens`
    counts: list[int]  # each slot's image tokens


def digest(image: PreparedImage) -> str:
    """What a picture is, for prompt reuse: its pixels as the processor gets them (a video: its sampled frames,
    where they were taken from and the sampling settings, vision.video.PreparedVideo.digest)."""
    if isinstance(image, PreparedVideo):
        return image.digest
    h = hashlib.sha256(f"{image.image.mode} {image.size}".encode())
    h.update(image.image.tobytes())
    return "image:" + h.hexdigest()


def decode_pictures(images: Sequence[ImagePart], folder: Path | str | None = None, room: int | None = None) -> list[PreparedImage]:
    """The request's image bytes as checked pictures, its videos decoded for the model in `folder` (at most `room`
    tokens each, else refused before decoding); EngineError(INVALID_REQUEST) naming the bad one."""
    import base64

    out: list[PreparedImage] = []
    for n, part in enumerate(images):
        try:
            if part.is_video:
                settings = VideoSettings(part.fps, part.max_frames)
                out.append(open_video(part.data, video_processor(str(folder)), settings, name=f"video {n + 1}", room=room))
            else:
                out.append(image_from_base64(base64.b64encode(part.data).decode(), part.media_type or "image/png", f"image {n + 1}"))
        except ImageError as exc:
            raise EngineError(str(exc), INVALID_REQUEST) from None
    return out


def extra_image_tokens(folder: Path | str, images: Sequence[ImagePart]) -> int:
    """How many tokens the pictures add to a rendered prompt (each placeholder widened to its image tokens), from
    the picture sizes and the folder's processor settings alone: no tower, no MLX (any thread)."""
    from PIL import Image

    processor = _image_processor(str(folder))
    extra = 0
    for n, part in enumerate(images):
        if part.is_video:
            extra += _video_tokens(folder, part, f"video {n + 1}")
            continue
        try:
            with Image.open(io.BytesIO(part.data)) as image:
                width, height = image.size
        except Exception:  # noqa: BLE001 - what Pillow raises for bad bytes varies; the request is refused by name
            raise EngineError(f"image {n + 1}: is not a picture Qwen Desk can read", INVALID_REQUEST) from None
        extra += processor.num_image_tokens(height, width) - 1
    return extra


def _video_tokens(folder: Path | str, part: ImagePart, name: str) -> int:
    """What a video adds to a rendered prompt, from its header and the sampling alone (no frame decoded): its video
    tokens, and per pair of frames two markers and its timestamp (vision.video.FramePlan.prompt_cost)."""
    import os
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix="qwen-desk-video-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(part.data)
        frames = plan(probe(tmp), video_processor(str(folder)), VideoSettings(part.fps, part.max_frames))
    except VideoError as exc:
        raise EngineError(f"{name}: {exc.problem}", INVALID_REQUEST) from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return frames.prompt_cost - 3  # the placeholder the template wrote


@functools.lru_cache(maxsize=4)
def _image_processor(folder: str) -> "Qwen3VLImageProcessor":
    from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLImageProcessor

    limits = ProcessorLimits.from_files(Path(folder))
    return Qwen3VLImageProcessor(
        patch_size=limits.patch_size,
        merge_size=limits.merge_size,
        temporal_patch_size=limits.temporal_patch_size,
        min_pixels=limits.min_pixels,
        max_pixels=min(limits.max_pixels, DEFAULT_MAX_PIXELS),
    )


def prepare(m: LoadedModel, tokens: list[int], boundaries: Sequence[int], images: Sequence[ImagePart], limit: int, text: str | None = None) -> PictureRequest:
    """A rendered prompt (one placeholder per picture) laid out with its pictures' image tokens; no tower run. With
    videos, `text` (the rendered prompt's text) is rendered again with each video's timestamps and a placeholder per
    pair of frames, as the processor writes them (engine.pictures.content_of does the same for a chat turn)."""
    try:
        vision = engine_pictures.vision_for(m)
        pictures = decode_pictures(images, m.path, limit)
        if any(isinstance(p, PreparedVideo) for p in pictures):
            if text is None:
                raise EngineError("A prompt with videos needs its text to place their timestamps.", ev.ERROR)
            tokens, boundaries = _with_timestamps(m, text, pictures)
        engine_pictures.check_room(vision, pictures, len(tokens), limit - 1)
    except EngineError as exc:
        raise EngineError(exc.message, INVALID_REQUEST) from exc  # the request cannot be served as sent: a 400
    slots = [i for i, t in enumerate(tokens) if t in vision.slot_token_ids]
    per_slot = [(image, count) for image in pictures for count in vision.slot_counts(image)]
    if len(slots) != len(per_slot):
        raise EngineError(f"The prompt has {len(slots)} picture placeholders for {len(per_slot)} pictures and video frame pairs.", INVALID_REQUEST)
    counts = [count for _, count in per_slot]
    widened: list[int] = []
    key: list[int | str] = []
    starts: list[int] = []
    last = 0
    for slot, (image, count) in zip(slots, per_slot):
        widened += tokens[last:slot]
        key += tokens[last:slot]
        starts.append(len(widened))
        widened += [tokens[slot]] * count
        key += [digest(image)] * count
        last = slot + 1
    widened += tokens[last:]
    key += tokens[last:]
    moved = [b + sum(c - 1 for s, c in zip(slots, counts) if s < b) for b in boundaries]
    slot_pictures = [image for image, _ in per_slot]
    return PictureRequest(vision, dataclasses.replace(m, model=vision.lm), widened, tuple(key), tuple(moved), slot_pictures, starts, counts)


def _with_timestamps(m: LoadedModel, text: str, pictures: Sequence[PreparedImage]) -> tuple[list[int], tuple[int, ...]]:
    """The prompt text with each video's block written per pair of frames (its timestamp, then a block), tokenized."""
    block = "<|vision_start|><|video_pad|><|vision_end|>"
    pieces = text.split(block)
    videos = [p for p in pictures if isinstance(p, PreparedVideo)]
    if len(pieces) - 1 != len(videos):
        raise EngineError(f"The prompt has {len(pieces) - 1} video placeholders for {len(videos)} videos.", INVALID_REQUEST)
    out = pieces[0]
    for video, piece in zip(videos, pieces[1:]):
        out += "".join(f"<{seconds:.1f} seconds>{block}" for seconds in video.plan.group_seconds) + piece
    tokens = list(m.tokenizer.encode(out, add_special_tokens=False))
    return tokens, boundaries(m.tokenizer, out, tokens)


def begin(request: PictureRequest, cache: PromptCache) -> EncodedTurn | None:
    """Set the positioned model up to read the rest of `request.tokens` into `cache` (which holds the first ones and
    the pictures among them); the tower runs on the pictures after. The EncodedTurn of those tokens (its embeddings
    hold the tower's features), or None when they hold no picture (plain token embeddings)."""
    lm = request.vision.lm
    cached = len(cache)
    lm.bind(cache.spans)
    if any(start < cached < start + count for start, count in zip(request.starts, request.counts)):
        raise ValueError(f"a checkpoint at {cached} tokens cuts a picture")  # boundaries are turn starts: never
    later = [n for n, start in enumerate(request.starts) if start >= cached]
    if not later:
        return None
    tail: list[int] = []
    at = cached
    for n in later:  # one placeholder per picture again, as encode takes the prompt
        tail += request.tokens[at : request.starts[n] + 1]
        at = request.starts[n] + request.counts[n]
    tail += request.tokens[at:]
    items = list({id(request.pictures[n]): request.pictures[n] for n in later}.values())  # a video has a slot per pair of frames
    encoded = request.vision.encode(tail, items)
    if encoded.tokens != request.tokens[cached:]:
        raise EngineError("The processor gave a picture a different number of image tokens than its size said.", ev.ERROR)
    lm.queue(encoded, cache.layers)
    return encoded
