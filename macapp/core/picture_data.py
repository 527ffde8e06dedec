"""Pictures as plain data, for the layers that carry them without looking at them: a request's picture bytes
(`ImagePart`, macapp.core.serving) and the history's reference to a stored picture (`ImageRef`,
macapp.core.history). No Pillow, no MLX: decoding, storing and running pictures is macapp.core.vision's."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class ImagePart:
    """Decoded image bytes from a request (data: URL or base64 source); the image support reads them."""

    data: bytes
    media_type: str = ""


@dataclass(frozen=True)
class ImageRef:
    """A picture as the history refers to it: a content hash naming a file in the app's pictures folder."""

    sha256: str  # of the stored PNG; the file is paths.pictures_dir() / f"{sha256}.png"
    name: str  # what the user called it (the file's name, or "pasted picture")
    width: int
    height: int

    @property
    def file_name(self) -> str:
        return f"{self.sha256}.png"

    @classmethod
    def from_dict(cls, raw: Any) -> "ImageRef":
        if not isinstance(raw, dict) or not _SHA256.match(str(raw.get("sha256", ""))):
            raise ValueError(f"not a picture reference: {str(raw)[:80]!r}")
        return cls(str(raw["sha256"]), str(raw.get("name") or "picture"), int(raw.get("width") or 0), int(raw.get("height") or 0))


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
