"""Pictures in the runtime: what a turn or a request with pictures needs before, during and after it.

- `open_pictures(items, limits)`: paths / bytes / PreparedImage → PreparedImage, each bad one an EngineError
  (code BAD_IMAGE) naming the file, before anything is read or saved;
- `vision_for(model)`: the tower of the loaded model, attached once into its `tower` slot (vision/tower.py; a
  text-only build: EngineError TEXT_ONLY with what to use instead; a model proxy that cannot run pictures, as
  on several Macs: EngineError saying so); it goes with the model;
- `content_of(message)`: a message as Qwen3.5's chat template takes it (image parts first, then the text);
- `check_room(...)`: too many image tokens for the context, said before the tower runs.
Run on the engine's worker thread.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from macapp.core import events as ev
from macapp.core.engine.errors import EngineError
from macapp.core.engine.messages import ChatMessage
from macapp.core.engine.model_proxy import pictures_refusal
from macapp.core.vision.builds import seeing_alternative
from macapp.core.vision.capability import VisionLoadError, folder_support, text_only_message
from macapp.core.vision.images import ImageError, PreparedImage, image_from_bytes, open_image
from macapp.core.vision.video import PreparedVideo, frames_that_fit

if TYPE_CHECKING:
    from macapp.core.engine.model_folder import LoadedModel
    from macapp.core.vision.runner import VisionModel

Picture = str | Path | bytes | PreparedImage

log = logging.getLogger(__name__)


def open_pictures(items: Iterable[Picture] | None, max_pixels: int | None = None) -> tuple[PreparedImage, ...]:
    """Every picture read and checked now; EngineError(BAD_IMAGE) naming the first bad one."""
    out = []
    for n, item in enumerate(items or ()):
        try:
            if isinstance(item, PreparedImage):
                image = item
            elif isinstance(item, bytes):
                image = image_from_bytes(item, f"picture {n + 1}", *(() if max_pixels is None else (max_pixels,)))
            else:
                image = open_image(item, *(() if max_pixels is None else (max_pixels,)))
        except ImageError as exc:
            raise EngineError(f"{exc}. The message was not sent.", ev.BAD_IMAGE) from None
        out.append(image)
    return tuple(out)


def vision_for(model: LoadedModel) -> VisionModel:
    """The VisionModel of a LoadedModel, attached into its tower slot on first use (reads only the tower's tensors)."""
    refusal = pictures_refusal(model.model)  # how the model is run (a proxy) decides first
    if refusal is not None:
        raise EngineError(refusal, ev.ERROR)
    if model.tower.vision is not None:
        return model.tower.vision
    support = folder_support(model.path)
    if not support.sees:
        message = text_only_message(model.info.name, seeing_alternative(model.info.name))
        raise EngineError(f"{message} ({support.why_not})", ev.TEXT_ONLY)
    try:
        vision = model.tower.attach(model.model, model.path)
    except VisionLoadError as exc:
        raise EngineError(f"{model.info.name}: its vision tower could not be read ({exc}).", ev.TEXT_ONLY) from exc
    log.info("vision tower of %s attached: %.1f MB in %.2f s", model.info.name, vision.vision_bytes / 1e6, vision.load_s)
    return vision


def attached_bytes(model: LoadedModel) -> int:
    """The tower's bytes when it is attached to this model (it stays in memory for the model's lifetime), else 0."""
    return model.tower.attached_bytes


def content_of(message: ChatMessage) -> str | list[dict[str, str]]:
    """A message's content for the chat template: with pictures, one image part per picture, then the text. A
    video (vision.video.PreparedVideo) is written as its processor writes it: each pair of frames' timestamp
    (text) before its own video part."""
    images = message.get("images") or ()
    text = message.get("content") or ""
    if not images:
        return text
    parts: list[dict[str, str]] = []
    for image in images:
        if isinstance(image, PreparedVideo):
            for seconds in image.plan.group_seconds:
                parts += [{"type": "text", "text": f"<{seconds:.1f} seconds>"}, {"type": "video"}]
        else:
            parts.append({"type": "image"})
    return parts + [{"type": "text", "text": text}]


def pictures_in(messages: Sequence[ChatMessage]) -> list[PreparedImage]:
    """Every picture of these messages, in order (what a prompt templated from them holds)."""
    return [image for message in messages for image in (message.get("images") or ())]


def check_room(vision: VisionModel, images: Sequence[PreparedImage], prompt_tokens: int, limit: int) -> None:
    """EngineError(CONTEXT_LIMIT) when the pictures' image tokens cannot fit the context, before the tower runs;
    EngineError(BAD_IMAGE) for pictures and a video read in one pass (mlx-vlm's Qwen3.5 runs its tower on one kind)."""
    kinds = {isinstance(image, PreparedVideo) for image in images}
    if len(kinds) > 1:
        raise EngineError(
            "Pictures and a video cannot be read in one pass (mlx-vlm's Qwen3.5 encodes one kind at a time): send the video "
            "in a message of its own, or start a new chat for it.",
            ev.BAD_IMAGE,
        )
    counts = [vision.image_token_count(image) for image in images]
    total = prompt_tokens - sum(len(vision.slot_counts(image)) for image in images) + sum(counts)  # a video: a slot per pair of frames
    if total > limit:
        each = ", ".join(f"{image.name}: {count:,}" for image, count in zip(images, counts))
        videos = [image for image in images if isinstance(image, PreparedVideo)]
        if videos:  # what would fit: the frames of the (last) video, with the room the rest leaves it
            video = videos[-1]
            room = limit - (total - video.plan.prompt_cost)
            fit = frames_that_fit(video.plan, vision.processor.video_processor, room)
            raise EngineError(
                f"{video.name}: the video does not fit the context: its {video.plan.frames} frames take {sum(vision.slot_counts(video)):,} "
                f"video tokens and the prompt would be {total:,} tokens, over the {limit:,}-token limit. "
                + (f"At most {fit} frames fit: attach it again with fewer frames, or start a new chat." if fit else "Start a new chat for it."),
                ev.CONTEXT_LIMIT,
            )
        raise EngineError(
            f"Too many pictures for the context: they take {sum(counts):,} image tokens ({each}) and the prompt would be "
            f"{total:,} tokens, over the {limit:,}-token limit. Send fewer or smaller pictures, or start a new chat.",
            ev.CONTEXT_LIMIT,
        )
