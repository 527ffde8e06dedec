"""`qwen-desk fit MODEL --video-frames N [--video-size WxH]`: a video's tower work counted in the total (the build's own
video processor sizing its frames), its prompt tokens, and how many frames fit the context."""

from __future__ import annotations

import json

from macapp.cli import main
from tests.fixtures.vision import tiny_vlm_path  # noqa: F401  (fixtures)

MAC = ["--chip", "M4 Pro", "--memory", "24GB", "--json"]


def _fit(capsys, *argv):
    code = main(["fit", *argv, *MAC])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_the_fit_counts_a_videos_frames_and_says_how_many_fit(capsys, tiny_vlm_path):
    small = _fit(capsys, str(tiny_vlm_path), "--video-frames", "4", "--video-size", "64x64")
    big = _fit(capsys, str(tiny_vlm_path), "--video-frames", "16", "--video-size", "64x64")
    assert (small["video"]["frames"], small["video"]["size"], small["video"]["video_tokens"]) == (4, [64, 64], 8)  # 2 pairs, 4 tokens each
    assert big["video"]["video_tokens"] == 32 and big["video"]["activation_bytes"] > small["video"]["activation_bytes"] > 0
    assert small["images"] is True  # counted in the total
    tight = _fit(capsys, str(tiny_vlm_path), "--video-frames", "16", "--video-size", "64x64", "--context", "40")
    assert tight["video"]["frames_that_fit"] == 6  # 3 pairs of 4 video tokens and 8 for their timestamps and marks
    plain = _fit(capsys, str(tiny_vlm_path))
    assert "video" not in plain


def test_bad_video_fit_arguments_are_refused(capsys, tiny_vlm_path):
    for flags, words in [(["--video-frames", "1"], "at least 2"), (["--video-frames", "8", "--video-size", "big"], "WIDTHxHEIGHT")]:
        assert main(["fit", str(tiny_vlm_path), *flags, *MAC]) == 2
        assert words in capsys.readouterr().err
