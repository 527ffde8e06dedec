"""A small file declaring a huge picture is refused from its header, never decoded at full size (issue #19:
a 17 KB PNG of 12,000 x 12,000 1-bit pixels took 270-670 MB)."""

from __future__ import annotations

import io
import resource
import time

import pytest
from PIL import Image

from macapp.core.vision.images import MAX_SOURCE_PIXELS, ImageError, image_from_bytes


@pytest.fixture(scope="module")
def bomb() -> bytes:
    buffer = io.BytesIO()
    Image.new("1", (12_000, 12_000)).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def test_a_12000_square_one_bit_png_is_refused_before_decoding(bomb):
    assert len(bomb) < 100_000 and 12_000 * 12_000 > MAX_SOURCE_PIXELS
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.process_time()  # this process's CPU time: another suite on the same cores does not count
    with pytest.raises(ImageError, match=r"upload\.png: is 12000x12000 pixels, more than Qwen Desk decodes"):
        image_from_bytes(bomb, "upload.png")
    assert time.process_time() - start < 1
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kb < 100_000  # the full-size decode alone would be 18 MB at 1 bit, 432 MB as RGB


def test_a_big_screenshot_is_still_read_and_scaled_down():
    buffer = io.BytesIO()
    Image.new("RGB", (7680, 4320), (10, 20, 30)).save(buffer, format="PNG")
    prepared = image_from_bytes(buffer.getvalue(), "8k.png", max_pixels=1_000_000)
    assert prepared.original_size == (7680, 4320) and prepared.size[0] * prepared.size[1] <= 1_000_000
