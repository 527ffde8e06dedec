"""Pictures as plain data, for the layers that carry them without looking at them: a request's picture bytes
(`ImagePart`, macapp.core.serving) and the history's reference to a stored picture (`ImageRef`,
macapp.core.history), where its file lies and its bytes as a data: URL. No Pillow, no MLX: decoding, storing and
running pictures is macapp.core.vision's, handed to the history as PictureFiles by whoever opens it."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from macapp.core import paths

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class ImagePart:
    """Decoded image bytes from a request (data: URL or base64 source); the image support reads them."""

    data: bytes
    media_type: str = ""
    fps: float | None = None  # a video (media type video/*): frames sampled per second; None: the model's
    max_frames: int | None = None  # a video: at most this many frames; None: the model's

    @property
    def is_video(self) -> bool:
        return self.media_type.lower().startswith("video/")


@dataclass(frozen=True)
class ImageRef:
    """A picture as the history refers to it: a content hash naming a file in the app's pictures folder."""

    sha256: str  # of the stored PNG; the file is paths.pictures_dir() / f"{sha256}.png"
    name: str  # what the user called it (the file's name, or "pasted picture")
    width: int
    height: int
    kind: str = "picture"  # or "video": its sampled frames as the model saw them, f"{sha256}.video.npz"

    @property
    def is_video(self) -> bool:
        return self.kind == "video"

    @property
    def file_name(self) -> str:
        return f"{self.sha256}.video.npz" if self.is_video else f"{self.sha256}.png"

    @classmethod
    def from_dict(cls, raw: object) -> "ImageRef":
        if not isinstance(raw, dict) or not _SHA256.match(str(raw.get("sha256", ""))):
            raise ValueError(f"not a picture reference: {str(raw)[:80]!r}")
        kind = "video" if raw.get("kind") == "video" else "picture"
        return cls(str(raw["sha256"]), str(raw.get("name") or "picture"), int(raw.get("width") or 0), int(raw.get("height") or 0), kind)


def refs_to_json(refs: tuple[ImageRef, ...] | list[ImageRef]) -> str:
    return json.dumps([asdict(ref) for ref in refs], sort_keys=True)


def refs_from_json(text: str | None) -> tuple[ImageRef, ...]:
    """The messages.images column back into refs; anything unreadable is dropped (the text is what matters)."""
    try:
        raw = json.loads(text or "[]")
    except ValueError:
        return ()
    out = []
    for item in raw if isinstance(raw, list) else ():
        try:
            out.append(ImageRef.from_dict(item))
        except (ValueError, TypeError):
            continue
    return tuple(out)


def picture_path(ref: ImageRef) -> Path:
    return paths.pictures_dir() / ref.file_name


def data_url(ref: ImageRef) -> str | None:
    """The stored picture as a data: URL for an export; None when its file is gone."""
    if ref.is_video:
        return None  # the model's frames are kept, not the video file: an export names the video (transfer.py)
    try:
        data = picture_path(ref).read_bytes()
    except OSError:
        return None
    return "data:image/png;base64," + base64.b64encode(data).decode()


@dataclass(frozen=True)
class PictureFiles:
    """What the history needs done to pictures that takes decoding them (macapp.core.vision.pictures.FILES): the
    history keeps them as plain data and is given this by the caller that opens it (Store.open(pictures=...))."""

    load: Callable[[tuple[ImageRef, ...]], tuple[Any, ...]]  # readable ones, as the engine takes them; the rest left out
    store_data_url: Callable[[str, str], ImageRef]  # (url, name) from an imported document; ValueError if not a picture
