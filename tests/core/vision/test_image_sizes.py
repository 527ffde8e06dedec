"""A picture larger than the processor takes comes out at the very size the processor resizes it to (its
smart_resize: same image tokens, nothing resized twice), decoded no larger than needed: a real 24-megapixel
JPEG and PNG, read in a fresh process whose peak RSS is measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from macapp.core.vision.images import DEFAULT_MAX_PIXELS, SIDE_FACTOR, image_from_bytes, processor_size

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("size", [(6000, 4000), (5000, 4000), (4000, 6000), (7680, 4320), (4097, 4097), (20000, 900)])
@pytest.mark.parametrize("max_pixels, min_pixels", [(DEFAULT_MAX_PIXELS, 65_536), (1_000_000, 65_536), (65_536, 1024)])
def test_the_size_is_the_processors_own(size, max_pixels, min_pixels):
    """Qwen3.5's processor (16.7 MP .. 65,536), a smaller one, and the tiny test model's (65,536 .. 1,024)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize  # the PIL backend: no torch

    width, height = size
    h, w = smart_resize(height, width, factor=SIDE_FACTOR, min_pixels=min_pixels, max_pixels=max_pixels)
    assert processor_size(width, height, max_pixels, min_pixels=min_pixels) == (w, h)
    # handed that size, the processor leaves it as it is
    assert smart_resize(h, w, factor=SIDE_FACTOR, min_pixels=min_pixels, max_pixels=max_pixels) == (h, w)


def test_a_large_picture_comes_out_at_that_size_upright():
    image = Image.new("RGB", (3000, 2000), (200, 10, 10))
    exif = Image.Exif()
    exif[0x0112] = 6  # shown turned a quarter
    buffer = __import__("io").BytesIO()
    image.save(buffer, "JPEG", exif=exif)
    prepared = image_from_bytes(buffer.getvalue(), "phone.jpg", max_pixels=1_000_000)
    assert prepared.size == processor_size(2000, 3000, 1_000_000)  # the upright picture's size
    assert prepared.original_size == (3000, 2000)


PEAK = """
import json, resource, sys
from macapp.core.vision.images import image_from_bytes
data = open(sys.argv[1], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
prepared = image_from_bytes(data, "big", int(sys.argv[2]))
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"size": prepared.size, "grown_mb": grown / 1024}))
"""


def peak(path: Path, max_pixels: int) -> dict:
    out = subprocess.run([sys.executable, "-c", PEAK, str(path), str(max_pixels)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def big_pictures(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("big")
    pixels = np.random.default_rng(0).integers(0, 255, (4000, 6000, 4), dtype=np.uint8)
    pixels[..., 3] = 255
    image = Image.fromarray(pixels, "RGBA")
    paths = {"png": folder / "big.png", "jpg": folder / "big.jpg"}
    image.save(paths["png"], compress_level=1)
    image.convert("RGB").save(paths["jpg"], quality=90)
    return paths


def test_a_24_megapixel_jpeg_is_decoded_at_a_fraction(big_pictures):
    result = peak(big_pictures["jpg"], 1_000_000)
    assert tuple(result["size"]) == processor_size(6000, 4000, 1_000_000)
    assert result["grown_mb"] < 40  # decoded whole it is 72 MB of RGB (before: 29 MB; now 1/4 scale, ~17 MB)


def test_a_24_megapixel_png_is_reduced_before_any_copy(big_pictures):
    result = peak(big_pictures["png"], 1_000_000)
    assert tuple(result["size"]) == processor_size(6000, 4000, 1_000_000)
    # decoding needs its 96 MB of RGBA; the orientation, RGBA and flattening copies used to add ~300 MB more
    assert result["grown_mb"] < 260


def test_at_qwen35s_own_limit_no_full_size_copy_is_made(big_pictures):
    for kind, bound in (("png", 360), ("jpg", 280)):  # before: 418 and 419 MB
        result = peak(big_pictures[kind], DEFAULT_MAX_PIXELS)
        assert tuple(result["size"]) == processor_size(6000, 4000, DEFAULT_MAX_PIXELS) == (4992, 3328), kind
        assert result["grown_mb"] < bound, (kind, result)
