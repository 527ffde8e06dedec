"""Every bad picture gets a clear message naming the file; big ones are scaled while decoding; GIFs give frame 1."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from macapp.core.vision import images
from macapp.core.vision.images import ImageError, image_from_bytes, open_image
from tests.fixtures.vision import picture_bytes


def test_a_good_picture_is_rgb_and_unchanged(picture):
    prepared = open_image(picture("cat.png", (120, 80)))
    assert prepared.image.mode == "RGB" and prepared.size == (120, 80) and not prepared.resized
    assert prepared.name.endswith("cat.png") and prepared.notes == ()
    assert Image.open(io.BytesIO(prepared.png_bytes())).size == (120, 80)


def test_missing_file(tmp_path):
    with pytest.raises(ImageError, match=r"nope\.png: no such file"):
        open_image(tmp_path / "nope.png")


def test_a_folder(tmp_path):
    with pytest.raises(ImageError, match="is a folder"):
        open_image(tmp_path)


def test_not_an_image(tmp_path):
    path = tmp_path / "notes.png"
    path.write_text("these are words, not pixels")
    with pytest.raises(ImageError, match=r"notes\.png: is not a picture Qwen Desk can read \(PNG, JPEG"):
        open_image(path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.jpg"
    path.write_bytes(b"")
    with pytest.raises(ImageError, match="empty.jpg: is empty"):
        open_image(path)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_picture(tmp_path, fmt):
    data = picture_bytes((300, 200), fmt)
    path = tmp_path / f"cut.{fmt.lower()}"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageError, match=r"cut\.\w+: is damaged or cut short"):
        open_image(path)


def test_corrupt_header(tmp_path):
    data = bytearray(picture_bytes((64, 64), "PNG"))
    data[16:24] = b"\x00" * 8  # zero width/height in IHDR
    path = tmp_path / "bad.png"
    path.write_bytes(bytes(data))
    with pytest.raises(ImageError, match=r"bad\.png: "):
        open_image(path)


def test_far_larger_than_the_processor_takes_is_scaled_down(picture):
    prepared = open_image(picture("big.png", (3000, 2000)), max_pixels=256 * 256)
    assert prepared.resized and prepared.original_size == (3000, 2000)
    w, h = prepared.size
    assert w * h <= 256 * 256 and abs(w / h - 1.5) < 0.02
    assert "scaled from 3000x2000" in prepared.notes[0]


def test_a_huge_jpeg_is_decoded_small_never_at_full_size(picture):
    path = picture("huge.jpg", (8000, 6000), "JPEG")
    prepared = open_image(path, max_pixels=100_000)
    assert prepared.size[0] * prepared.size[1] <= 100_000 and prepared.original_size == (8000, 6000)


def test_beyond_what_is_decoded_at_all_is_refused(monkeypatch, picture):
    monkeypatch.setattr(images, "MAX_SOURCE_PIXELS", 1000)
    with pytest.raises(ImageError, match=r"wide\.png: is 100x50 pixels, more than Qwen Desk decodes"):
        open_image(picture("wide.png", (100, 50)), max_pixels=10)


def test_animated_gif_gives_its_first_frame(tmp_path):
    frames = [Image.new("RGB", (40, 30), color) for color in [(255, 0, 0), (0, 255, 0), (0, 0, 255)]]
    path = tmp_path / "anim.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=100, loop=0)
    prepared = open_image(path)
    assert prepared.frames == 3 and "first frame" in prepared.notes[0]
    r, g, b = prepared.image.getpixel((5, 5))
    assert r > 200 and g < 50 and b < 50


def test_transparency_is_flattened_onto_white():
    image = Image.new("RGBA", (10, 10), (0, 0, 0, 0))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    prepared = image_from_bytes(buffer.getvalue(), "clear.png")
    assert prepared.image.mode == "RGB" and prepared.image.getpixel((3, 3)) == (255, 255, 255)


def test_exif_orientation_is_applied():
    image = Image.new("RGB", (40, 20), (10, 20, 30))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees when shown
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", exif=exif)
    assert image_from_bytes(buffer.getvalue(), "phone.jpg").size == (20, 40)


def _png_header_only(path, width, height):
    """A few hundred bytes claiming width x height RGB pixels (a decompression bomb): never decoded."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 1000)) + chunk(b"IEND", b""))
    return path


def test_a_picture_claiming_gigapixels_is_refused_before_any_decoding(tmp_path):
    path = _png_header_only(tmp_path / "bomb.png", 40_000, 40_000)  # 4.8 GB of RGB if it were decoded
    with pytest.raises(ImageError, match=r"bomb\.png: is far too large to read \(over 180 megapixels\): scale it down first"):
        open_image(path)
    with pytest.raises(ImageError, match=r"image 1: is far too large"):  # the same over the API
        image_from_bytes(path.read_bytes(), "image 1")
