"""Pictures in a chat session (engine side): what a send with pictures needs before, during and after its turn.

- `open_pictures(items, limits)`: paths / bytes / PreparedImage → PreparedImage, each bad one an EngineError
  (code BAD_IMAGE) naming the file, before anything is read or saved;
- `vision_for(model)`: the tower attached to the loaded model, once (a text-only build: EngineError TEXT_ONLY
  with what to use instead); `drop_vision()` when the model goes;
- `content_of(message)`: a message as Qwen3.5's chat template takes it (image parts first, then the text);
- `check_room(...)`: too many image tokens for the context, said before the tower runs.
Run on the engine's worker thread.
"""

from __future__ import annotations

import logging
import weakref
from pathlib import Path
from typing import Any, Iterable, Sequence

from macapp.core import events as ev
from macapp.core.engine.errors import EngineError
from macapp.core.vision.capability import folder_support, text_only_message
from macapp.core.vision.images import ImageError, PreparedImage, image_from_bytes, open_image

Picture = str | Path | bytes | PreparedImage

log = logging.getLogger(__name__)
_attached: tuple[Any, Any] | None = None  # (weakref to the LoadedModel, its VisionModel): one model at a time


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


def vision_for(model: Any) -> Any:
    """The VisionModel for a LoadedModel, attached on first use (reads only the tower's tensors)."""
    global _attached
    if _attached is not None and _attached[0]() is model:
        return _attached[1]
    from macapp.core.cluster.lockstep import LockstepModel

    if isinstance(model.model, LockstepModel):  # the ranks run only token forward passes in lock step
        raise EngineError("Pictures are not supported on several Macs yet: send them in a chat on one Mac.", ev.ERROR)
    support = folder_support(model.path)
    if not support.sees:
        from macapp.core.vision.builds import seeing_alternative

        message = text_only_message(model.info.name, seeing_alternative(model.info.name))
        raise EngineError(f"{message} ({support.why_not})", ev.TEXT_ONLY)
    from macapp.core.vision.runner import VisionLoadError, attach_vision

    try:
        vision = attach_vision(model.model, model.path)
    except VisionLoadError as exc:
        raise EngineError(f"{model.info.name}: its vision tower could not be read ({exc}).", ev.TEXT_ONLY) from exc
    _attached = (weakref.ref(model), vision)
    log.info("vision tower of %s attached: %.1f MB in %.2f s", model.info.name, vision.vision_bytes / 1e6, vision.load_s)
    weakref.finalize(model, _forget, id(vision))  # the tower and the shared arrays go with the model
    return vision


def _forget(vision_id: int) -> None:
    if _attached is not None and id(_attached[1]) == vision_id:
        drop_vision()


def attached_bytes(model: Any) -> int:
    """The tower's bytes when it is attached to this model (it stays in memory for the model's lifetime), else 0."""
    if _attached is not None and _attached[0]() is model:
        return _attached[1].vision_bytes
    return 0


def drop_vision() -> None:
    global _attached
    _attached = None


def content_of(message: dict) -> Any:
    """A message's content for the chat template: with pictures, one image part per picture, then the text."""
    images = message.get("images") or ()
    text = message.get("content") or ""
    if not images:
        return text
    return [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]


def pictures_in(messages: Sequence[dict]) -> list[PreparedImage]:
    """Every picture of these messages, in order (what a prompt templated from them holds)."""
    return [image for message in messages for image in (message.get("images") or ())]


def check_room(vision: Any, images: Sequence[PreparedImage], prompt_tokens: int, limit: int) -> None:
    """EngineError(CONTEXT_LIMIT) when the pictures' image tokens cannot fit the context, before the tower runs."""
    counts = [vision.image_token_count(image) for image in images]
    total = prompt_tokens - len(images) + sum(counts)
    if total > limit:
        each = ", ".join(f"{image.name}: {count:,}" for image, count in zip(images, counts))
        raise EngineError(
            f"Too many pictures for the context: they take {sum(counts):,} image tokens ({each}) and the prompt would be "
            f"{total:,} tokens, over the {limit:,}-token limit. Send fewer or smaller pictures, or start a new chat.",
            ev.CONTEXT_LIMIT,
        )
