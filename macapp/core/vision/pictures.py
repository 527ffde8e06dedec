"""Pictures kept for the history: saved once into the app's data folder (content-addressed PNG), loaded back when
a conversation is reopened, and carried inside exported conversations as data: URLs."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from macapp.core.picture_data import ImageRef, PictureFiles, data_url, picture_path
from macapp.core.vision.dataurl import image_from_url
from macapp.core.vision import video_files
from macapp.core.vision.images import ImageError, PreparedImage, image_from_bytes
from macapp.core.vision.video import PreparedVideo

__all__ = ["FILES", "data_url", "import_data_url", "load_picture", "load_pictures", "picture_path", "save_picture"]


def save_picture(image: PreparedImage) -> ImageRef:
    """Store the picture (as the model saw it) and return its reference; the same picture is stored once. A video:
    its sampled frames and their plan (vision.video_files), named by its content digest."""
    if isinstance(image, PreparedVideo):
        ref = ImageRef(image.digest.removeprefix("video:"), Path(image.name).name or "video", image.size[0], image.size[1], kind="video")
        _write_once(picture_path(ref), video_files.to_bytes(image))
        return ref
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
    if ref.is_video:
        return video_files.from_bytes(data, ref.name)
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


def import_data_url(url: str, name: str) -> ImageRef:
    """A picture from an imported document, stored like a sent one; ImageError when it is not a readable picture."""
    return save_picture(image_from_url(url, name))


# What the history is given to reopen and import pictures (Store.open(pictures=FILES)); the names are looked up
# when called, so a replaced module function (a test's watch) is the one that runs.
FILES = PictureFiles(load=lambda refs: load_pictures(refs), store_data_url=lambda url, name: import_data_url(url, name))
