"""`--video PATH [--video-fps F] [--video-max-frames N]` for `qwen-desk chat`: the settings checked before anything
loads, the video opened once the model is (its processor decides the frames' size; refused before decoding, with
the frames that would fit, when the context cannot take it)."""

from __future__ import annotations

import argparse
import sys

from macapp.cli import UsageError
from macapp.core.engine import Engine
from macapp.core.vision.builds import seeing_alternative
from macapp.core.vision.capability import folder_support, text_only_message
from macapp.core.vision.mlx_frames import video_processor
from macapp.core.vision.video import PreparedVideo, VideoError, VideoSettings, open_video


def video_arguments(args: argparse.Namespace) -> VideoSettings:
    """The sampling flags, checked (UsageError); they need --video."""
    settings = VideoSettings(fps=args.video_fps, max_frames=args.video_max_frames)
    if not args.video and settings != VideoSettings():
        raise UsageError("--video-fps and --video-max-frames need --video PATH")
    try:
        settings.check()
    except ValueError as exc:
        raise UsageError(str(exc).replace("video fps", "--video-fps").replace("video max frames", "--video-max-frames")) from None
    return settings


def open_video_argument(engine: Engine, path: str, settings: VideoSettings, context: int | None) -> PreparedVideo:
    """The --video file decoded for the loaded model; UsageError naming it (a text-only build, a bad file, too long)."""
    model = engine.model
    assert model is not None  # loaded by the caller
    support = folder_support(model.path)
    if not support.sees:
        raise UsageError(f"--video {path}: {text_only_message(model.info.name, seeing_alternative(model.info.name))} ({support.why_not})")
    room = min(context or model.info.max_context, model.info.max_context)
    try:
        video = open_video(path, video_processor(model.path), settings, room=room, progress=_progress if sys.stderr.isatty() else None)
    except VideoError as exc:
        raise UsageError(str(exc)) from None
    plan = video.plan
    print(
        f"[{video.name}: {plan.info.duration_s:.1f} s, {plan.frames} of {plan.info.total_frames} frames at "
        f"{plan.size[0]}x{plan.size[1]}, {plan.video_tokens:,} video tokens]",
        file=sys.stderr,
    )
    return video


def _progress(done: int, total: int) -> None:
    print(f"\r[decoding frame {done}/{total}]", end="" if done < total else "\n", file=sys.stderr, flush=True)
