"""API pictures: data: URLs and base64 sources are read; remote URLs and bad data are refused clearly."""

from __future__ import annotations

import base64

import pytest

from macapp.core.vision.dataurl import RemoteImageRefused, image_from_base64, image_from_data_url, image_from_url
from macapp.core.vision.images import ImageError
from tests.fixtures.vision import picture_bytes


def _b64(fmt="PNG", size=(50, 40)) -> str:
    return base64.b64encode(picture_bytes(size, fmt)).decode()


def test_data_url_png_and_jpeg():
    assert image_from_url("data:image/png;base64," + _b64()).size == (50, 40)
    assert image_from_data_url("data:image/jpeg;base64," + _b64("JPEG"), "part 2").name == "part 2"


def test_the_bytes_decide_the_format_not_the_label():
    assert image_from_url("data:image/jpg;base64," + _b64()).size == (50, 40)  # PNG bytes labelled image/jpg


def test_anthropic_base64_source():
    assert image_from_base64(_b64(), "image/png", "block 0").size == (50, 40)


@pytest.mark.parametrize("url", ["https://example.com/cat.png", "HTTP://10.0.0.1/x.jpg"])
def test_remote_urls_are_refused_never_fetched(url):
    with pytest.raises(RemoteImageRefused, match="remote image URLs are not fetched"):
        image_from_url(url, "messages[0].content[1]")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("file:///etc/passwd", "must be a data: URL"),
        ("data:image/png,rawbytes", "must be base64-encoded"),
        ("data:image/png;base64,@@@notbase64@@@", "not valid base64"),
        ("data:text/plain;base64," + base64.b64encode(b"hi").decode(), "not a picture type"),
        ("data:image/png;base64," + base64.b64encode(b"not a png").decode(), "is not a picture Qwen Desk can read"),
        ("data:nonsense", "not a valid data: URL"),
    ],
)
def test_bad_data_urls(url, problem):
    with pytest.raises(ImageError, match=problem) as info:
        image_from_url(url, "part 1")
    assert str(info.value).startswith("part 1: ")


def test_base64_with_line_breaks_is_accepted():
    wrapped = "\n".join(_b64()[i : i + 76] for i in range(0, len(_b64()), 76))
    assert image_from_base64(wrapped, "image/png").size == (50, 40)
