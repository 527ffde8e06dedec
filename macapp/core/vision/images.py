"""Reading a picture safely: every bad input becomes an `ImageError` that names the file, never a crash or a
memory blow-up.

- missing file / a folder / unreadable → said so;
- not an image (Pillow cannot identify it) → the formats it reads;
- damaged or cut short → said so (the whole image is decoded here, not later inside the model);
- far larger than the processor takes → scaled down while decoding (JPEG's `draft` decodes at 1/2..1/8 scale,
  `reduce` / `thumbnail` for the rest), so the pixels held are bounded by `max_pixels`; a picture claiming more
  than Pillow's decompression-bomb limit (~179 megapixels, any format) is refused from its header, before any
  decoding, and `MAX_SOURCE_PIXELS` bounds a non-JPEG should that limit be raised;
- animated (GIF, APNG, WebP) → its first frame, with a note;
- orientation (EXIF) applied, transparency flattened onto white, converted to RGB.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Pillow is imported on the first picture, not when the window paints
    from PIL import Image

# A non-JPEG (no decoding at a reduced scale) is decoded at full size only up to this: ~160 MB at 4 bytes a pixel,
# held only until it is scaled down (an 8K screenshot is 33 megapixels). A 17 KB PNG can claim 144 megapixels
# (12,000 x 12,000 at 1 bit): refused from its header. Pillow's own bomb limit refuses any picture above ~179 MP.
MAX_SOURCE_PIXELS = 40_000_000
# Without a processor's own limit (Qwen3.5's preprocessor_config says 16,777,216 pixels).
DEFAULT_MAX_PIXELS = 16_777_216
READABLE = "PNG, JPEG, GIF, WebP, BMP or TIFF"


class ImageError(ValueError):
    """A picture that cannot be used; the message names the file and what to do."""

    def __init__(self, name: str, problem: str):
        super().__init__(f"{name}: {problem}")
        self.name = name
        self.problem = problem


@dataclass(frozen=True)
class PreparedImage:
    """A validated picture, RGB, at most `max_pixels`, ready for the processor."""

    name: str  # the file's name (or the label of pasted / uploaded data)
    image: Image.Image = field(repr=False, compare=False)
    original_size: tuple[int, int]
    frames: int = 1
    notes: tuple[str, ...] = ()

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size

    @property
    def resized(self) -> bool:
        return self.size != self.original_size

    def png_bytes(self) -> bytes:
        buffer = io.BytesIO()
        self.image.save(buffer, format="PNG")
        return buffer.getvalue()


def open_image(path: str | Path, max_pixels: int = DEFAULT_MAX_PIXELS) -> PreparedImage:
    """A picture file → PreparedImage, or ImageError naming it."""
    path = Path(path).expanduser()
    name = str(path)
    if not path.exists():
        raise ImageError(name, "no such file: check the path")
    if path.is_dir():
        raise ImageError(name, "is a folder, not a picture")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ImageError(name, f"cannot be read ({exc.strerror or exc})") from None
    return image_from_bytes(data, name, max_pixels)


def image_from_bytes(data: bytes, name: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> PreparedImage:
    """Encoded picture bytes (a file's, a paste's, an upload's) → PreparedImage, or ImageError naming `name`."""
    if not data:
        raise ImageError(name, "is empty (0 bytes)")
    from PIL import Image, UnidentifiedImageError

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data))
        except Image.DecompressionBombError:
            raise ImageError(name, "is far too large to read (over 180 megapixels): scale it down first") from None
        except UnidentifiedImageError:
            raise ImageError(name, f"is not a picture Qwen Desk can read ({READABLE})") from None
        except (OSError, ValueError, SyntaxError) as exc:
            raise ImageError(name, f"is damaged ({exc})") from None
        return _prepare(image, name, max_pixels)


def _prepare(image: Image.Image, name: str, max_pixels: int) -> PreparedImage:
    original = image.size
    width, height = original
    if width <= 0 or height <= 0:
        raise ImageError(name, "has no pixels")
    notes: list[str] = []
    frames = int(getattr(image, "n_frames", 1) or 1)
    if frames > 1:
        image.seek(0)
        notes.append(f"animated ({frames} frames): the first frame is used")
    if image.format == "JPEG" and width * height > max_pixels:
        scale = (max_pixels / (width * height)) ** 0.5
        image.draft("RGB", (max(1, int(width * scale)), max(1, int(height * scale))))
    elif width * height > MAX_SOURCE_PIXELS:
        raise ImageError(
            name, f"is {width}x{height} pixels, more than Qwen Desk decodes ({MAX_SOURCE_PIXELS // 1_000_000} megapixels): scale it down first"
        )
    try:
        image.load()
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise ImageError(name, f"is damaged or cut short ({exc}): save or export it again") from None
    image = _upright_rgb(image)
    if image.width * image.height > max_pixels:
        image = _shrink(image, max_pixels)
    if image.size != original:
        notes.append(f"scaled from {original[0]}x{original[1]} to {image.width}x{image.height}")
    return PreparedImage(name=name, image=image, original_size=original, frames=frames, notes=tuple(notes))


def _upright_rgb(image: Image.Image) -> Image.Image:
    from PIL import Image, ImageOps

    try:
        image = ImageOps.exif_transpose(image)
    except (OSError, ValueError, SyntaxError):
        pass  # a broken EXIF block: keep the pixels as stored
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        flat = Image.new("RGB", rgba.size, (255, 255, 255))
        flat.paste(rgba, mask=rgba.getchannel("A"))
        return flat
    return image.convert("RGB") if image.mode != "RGB" else image


def _shrink(image: Image.Image, max_pixels: int) -> Image.Image:
    scale = (max_pixels / (image.width * image.height)) ** 0.5
    target = (max(1, int(image.width * scale)), max(1, int(image.height * scale)))
    factor = min(image.width // target[0], image.height // target[1])
    if factor >= 2:
        image = image.reduce(factor)  # cheap integer box reduction first
    image = image.copy()
    from PIL import Image

    image.thumbnail(target, Image.Resampling.LANCZOS)
    return image
