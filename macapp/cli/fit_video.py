"""`qwen-desk fit MODEL --video-frames N [--video-size WxH]`: the fit counting a video of N frames (the tower's work
over all of them at once, in the total and the largest context) and saying how many frames fit the context."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

from macapp.cli import UsageError
from macapp.core import catalog
from macapp.core.fit.picture_cost import VisionCost
from macapp.core.vision.builds import downloaded_folder
from macapp.core.vision.mlx_frames import video_processor
from macapp.core.vision.video import VideoWork, most_frames, video_work

DEFAULT_SIZE = (1920, 1080)


def add_video_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--video-frames", type=int, metavar="N", help="count a video of N sampled frames too (its tower work and tokens)")
    parser.add_argument("--video-size", default="1920x1080", metavar="WxH", help="the video's frame size (default 1920x1080)")


def _size(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*[xX×]\s*(\d+)\s*", text)
    if not match or not all(int(g) >= 32 for g in match.groups()):
        raise UsageError(f"--video-size {text!r} is not WIDTHxHEIGHT with both sides at least 32 (e.g. 1920x1080)")
    return int(match.group(1)), int(match.group(2))


def video_fit(args: argparse.Namespace, model: catalog.ModelRef, vision: VisionCost | None) -> tuple[VisionCost | None, VideoWork | None, int]:
    """The vision cost with the video's tower work in place of one picture's (when larger), the work, and the most
    frames that fit the --context; (vision, None, 0) without --video-frames."""
    if args.video_frames is None:
        return vision, None, 0
    if args.video_frames < 2:
        raise UsageError("--video-frames must be at least 2: frames are read in pairs")
    folder = model.local_path or downloaded_folder(model.repo)
    if folder is None:
        from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLVideoProcessor

        processor = Qwen3VLVideoProcessor()  # mlx-vlm's Qwen3-VL defaults until the build's files are here
    else:
        processor = video_processor(str(Path(folder)))
    source = _size(args.video_size)
    patches = vision.max_image_tokens * 4 if vision is not None else 0  # a picture at the maximum: 2x2 patches a token
    patch_bytes = vision.image_activation_bytes / patches if vision is not None and patches else 0.0
    work = video_work(args.video_frames, processor, source, patch_bytes)
    fit = most_frames(processor, source, args.context, max(args.video_frames, processor.max_frames))
    if vision is not None:
        vision = dataclasses.replace(vision, image_activation_bytes=max(vision.image_activation_bytes, work.activation_bytes))
    return vision, work, fit


def video_words(work: VideoWork, fit: int, context: int) -> str:
    return (
        f"video: {work.frames} frames of {work.source[0]}x{work.source[1]} at {work.size[0]}x{work.size[1]}: about {work.prompt_tokens:,} prompt tokens "
        f"({work.video_tokens:,} video tokens), {work.activation_bytes / 1e9:.2f} GB while the tower encodes them, counted in the total; "
        f"at most {fit} frames fit a {context:,}-token context"
    )
