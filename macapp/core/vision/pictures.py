"""Pictures kept for the history: saved once into the app's data folder (content-addressed PNG), loaded back when
a conversation is reopened, and carried inside exported conversations as data: URLs."""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
from pathlib import Path

from macapp.core import paths
from macapp.core.vision.images import ImageError, PreparedImage, image_from_bytes
from macapp.core.picture_data import ImageRef


def picture_path(ref: ImageRef) -> Path:
    return paths.pictures_dir() / ref.file_name


def save_picture(image: PreparedImage) -> ImageRef:
    """Store the picture (as the model saw it) and return its reference; the same picture is stored once."""
    data = image.png_bytes()
    ref = ImageRef(hashlib.sha256(data).hexdigest(), Path(image.name).name or "picture", image.size[0], image.size[1])
    _write_once(picture_path(ref), data)
    return ref


def _write_once(path: Path, data: bytes) -> None:
    if path.is_file() and path.stat().st_size == len(data):
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".incoming-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic: a reader never sees half a picture
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_picture(ref: ImageRef) -> PreparedImage:
    """The stored picture again; ImageError if its file is gone or damaged."""
    path = picture_path(ref)
    try:
        data = path.read_bytes()
    except OSError:
        raise ImageError(ref.name, "its stored copy is missing from the pictures folder") from None
    image = image_from_bytes(data, ref.name)
    return PreparedImage(name=ref.name, image=image.image, original_size=image.original_size)


def load_pictures(refs: tuple[ImageRef, ...]) -> tuple[PreparedImage, ...]:
    """A saved message's pictures read back; one whose file is gone or damaged is left out (the text stays)."""
    out = []
    for ref in refs:
        try:
            out.append(load_picture(ref))
        except ImageError:
            continue
    return tuple(out)


def data_url(ref: ImageRef) -> str | None:
    """The stored picture as a data: URL for an export; None when its file is gone."""
    try:
        data = picture_path(ref).read_bytes()
    except OSError:
        return None
    return "data:image/png;base64," + base64.b64encode(data).decode()


def import_data_url(url: str, name: str) -> ImageRef:
    """A picture from an imported document, stored like a sent one; ImageError when it is not a readable picture."""
    from macapp.core.vision.dataurl import image_from_url

    return save_picture(image_from_url(url, name))
