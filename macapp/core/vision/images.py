"""Reading a picture safely: every bad input becomes an `ImageError` that names the file, never a crash or a
memory blow-up.

- missing file / a folder / unreadable → said so;
- not an image (Pillow cannot identify it) → the formats it reads;
- damaged or cut short → said so (the whole image is decoded here, not later inside the model);
- larger than the processor takes → brought to the very size the processor would resize it to (its
  `smart_resize`: sides multiples of patch x merge, at most `max_pixels`), so the model sees the same number of
  image tokens, but never decoded larger than needed for it: JPEG's `draft` decodes at 1/2..1/8 scale (never
  below that size), an integer `reduce` shrinks the rest right after decoding, before the orientation and RGB
  copies are made, then one bicubic resize (the processor's own filter) to the size; a picture claiming more
  than Pillow's decompression-bomb limit (~179 megapixels, any format) is refused from its header, before any
  decoding, and `MAX_SOURCE_PIXELS` bounds a non-JPEG should that limit be raised;
- animated (GIF, APNG, WebP) → its first frame, with a note;
- orientation (EXIF) applied, transparency flattened onto white, converted to RGB.
"""

from __future__ import annotations

import io
import math
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
# Qwen3.5's processor geometry (macapp/core/fit/picture_cost.py ProcessorLimits): patch 16 x merge 2, at least 65,536 pixels.
SIDE_FACTOR = 32
MIN_PIXELS = 65_536
ORIENTATION = 0x0112  # the EXIF tag
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
    target = processor_size(width, height, max_pixels) if width * height > max_pixels else None
    if image.format == "JPEG" and target is not None:
        image.draft("RGB", target)  # the smallest 1/2..1/8 scale still at least `target` on both sides
    elif width * height > MAX_SOURCE_PIXELS:
        raise ImageError(name, f"is {width}x{height} pixels, more than Qwen Desk decodes ({MAX_SOURCE_PIXELS // 1_000_000} megapixels): scale it down first")
    try:
        image.load()
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise ImageError(name, f"is damaged or cut short ({exc}): save or export it again") from None
    if target is not None:
        image = _reduce_towards(image, target)
    stored = image.size
    image = _upright_rgb(image)
    if target is not None:
        if image.size != stored and image.size == stored[::-1]:  # EXIF turned it a quarter: so is the target
            target = target[::-1]
        if image.size != target:
            from PIL import Image

            image = image.resize(target, Image.Resampling.BICUBIC)
    if image.size != original:
        notes.append(f"scaled from {original[0]}x{original[1]} to {image.width}x{image.height}")
    return PreparedImage(name=name, image=image, original_size=original, frames=frames, notes=tuple(notes))


def _upright_rgb(image: Image.Image) -> Image.Image:
    from PIL import Image, ImageOps

    try:
        # a copy only when it turns the picture (exif_transpose copies even an upright one otherwise)
        if image.getexif().get(ORIENTATION, 1) != 1:
            image = ImageOps.exif_transpose(image)
    except (OSError, ValueError, SyntaxError):
        pass  # a broken EXIF block: keep the pixels as stored
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image if image.mode == "RGBA" else image.convert("RGBA")
        flat = Image.new("RGB", rgba.size, (255, 255, 255))
        flat.paste(rgba, mask=rgba.getchannel("A"))
        return flat
    return image.convert("RGB") if image.mode != "RGB" else image


def processor_size(width: int, height: int, max_pixels: int, factor: int = SIDE_FACTOR, min_pixels: int = MIN_PIXELS) -> tuple[int, int]:
    """(width, height) the Qwen-VL image processor resizes a width x height picture to (its `smart_resize`)."""
    min_pixels = min(min_pixels, max_pixels)
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(width * height / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (width * height))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return w_bar, h_bar


def _reduce_towards(image: Image.Image, target: tuple[int, int]) -> Image.Image:
    """An integer box reduction staying at least `target` on both sides, done on the decoded pixels before any
    full-size copy is made (a JPEG drafted already is close to it). Modes `reduce` does not take are left as they are."""
    factor = min(image.width // target[0], image.height // target[1])
    if factor < 2:
        return image
    try:
        return image.reduce(factor)
    except ValueError:
        return image
