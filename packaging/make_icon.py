"""Draw the Qwen Desk app icon (resources/icon.png, 1024×1024) and its macOS .icns from plain shapes.

Only geometry, no fonts, so the same Pillow gives the same pixels on any machine:
    .venv/bin/python packaging/make_icon.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from PIL import Image, ImageChops, ImageDraw, ImageFilter

SIZE = 1024
# Draw at 4× and downsample: Pillow's shapes are not anti-aliased.
SCALE = 4
ROOT = Path(__file__).resolve().parents[1]
PNG_PATH = ROOT / "resources" / "icon.png"
ICNS_PATH = ROOT / "resources" / "icon.icns"

# macOS icon grid: an 824-px rounded square centred on the 1024 canvas, corner radius ~185.
TILE_INSET = 100
TILE_RADIUS = 185
TOP_COLOUR = (124, 92, 255)  # violet
BOTTOM_COLOUR = (38, 54, 170)  # deep indigo
BUBBLE_COLOUR = (255, 255, 255, 255)
INK_COLOUR = (70, 62, 200, 255)


def _s(value: float) -> int:
    return round(value * SCALE)


def _vertical_gradient(size: int, top: tuple[int, int, int], bottom: tuple[int, int, int]) -> Image.Image:
    column = Image.new("RGB", (1, 256))
    for y in range(256):
        t = y / 255
        column.putpixel((0, y), tuple(round(a + (b - a) * t) for a, b in zip(top, bottom)))
    return column.resize((size, size), Image.Resampling.BICUBIC)


def _tile_mask(size: int) -> Image.Image:
    mask = Image.new("L", (size, size), 0)
    inset, radius = _s(TILE_INSET), _s(TILE_RADIUS)
    ImageDraw.Draw(mask).rounded_rectangle((inset, inset, size - inset, size - inset), radius=radius, fill=255)
    return mask


def _bubble_mask(size: int) -> Image.Image:
    """A speech bubble: a rounded rectangle with a tail at the lower left."""
    mask = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(mask)
    draw.rounded_rectangle((_s(232), _s(262), _s(792), _s(702)), radius=_s(150), fill=255)
    draw.polygon([(_s(330), _s(640)), (_s(470), _s(690)), (_s(276), _s(812))], fill=255)
    return mask


def _q_mask(size: int) -> Image.Image:
    """The letter Q: a thick ring and a diagonal tail, centred in the bubble."""
    mask = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(mask)
    cx, cy, outer, stroke = 512, 478, 150, 58
    draw.ellipse((_s(cx - outer), _s(cy - outer), _s(cx + outer), _s(cy + outer)), fill=255)
    inner = outer - stroke
    draw.ellipse((_s(cx - inner), _s(cy - inner), _s(cx + inner), _s(cy + inner)), fill=0)
    start, end = (cx + 45, cy + 45), (cx + 150, cy + 150)
    draw.line((_s(start[0]), _s(start[1]), _s(end[0]), _s(end[1])), fill=255, width=_s(stroke))
    r = stroke / 2
    for x, y in (start, end):  # round caps
        draw.ellipse((_s(x - r), _s(y - r), _s(x + r), _s(y + r)), fill=255)
    return mask


def draw_icon() -> Image.Image:
    """The icon as a 1024×1024 RGBA image (transparent outside the rounded square)."""
    big = SIZE * SCALE
    canvas = Image.new("RGBA", (big, big), (0, 0, 0, 0))

    tile = _tile_mask(big)
    # A soft drop shadow under the tile, as macOS icons have.
    shadow = tile.filter(ImageFilter.GaussianBlur(_s(14)))
    shadow = ImageChops.offset(shadow, 0, _s(12)).point(lambda v: v * 0.35)
    canvas.paste((0, 0, 0, 255), (0, 0), shadow)

    gradient = _vertical_gradient(big, TOP_COLOUR, BOTTOM_COLOUR).convert("RGBA")
    canvas.paste(gradient, (0, 0), tile)

    bubble = _bubble_mask(big)
    bubble_shadow = ImageChops.offset(bubble.filter(ImageFilter.GaussianBlur(_s(10))), 0, _s(10)).point(lambda v: v * 0.25)
    canvas.paste((0, 0, 40, 255), (0, 0), ImageChops.multiply(bubble_shadow, tile))
    canvas.paste(BUBBLE_COLOUR, (0, 0), bubble)
    canvas.paste(INK_COLOUR, (0, 0), ImageChops.multiply(_q_mask(big), bubble))

    return canvas.resize((SIZE, SIZE), Image.Resampling.LANCZOS)


def write_icons(png_path: Path = PNG_PATH, icns_path: Path = ICNS_PATH) -> tuple[Path, Path]:
    """Write the PNG source and the .icns (Pillow writes every size macOS asks for, 16 to 1024)."""
    icon = draw_icon()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    icon.save(png_path, optimize=True)
    icon.save(icns_path)
    return png_path, icns_path


def main() -> int:
    for path in write_icons():
        print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
