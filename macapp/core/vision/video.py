"""Reading a video safely, frame by frame, into exactly what mlx-vlm's own video path gives the model.

mlx-vlm (`mlx_vlm.utils.load_video` then the Qwen3-VL video processor) decodes the sampled frames at full
resolution and resizes them all at the end: a 4K clip would hold gigabytes. Here each sampled frame is resized
to the processor's size right after it is decoded (the processor's own sizing and bicubic resize, `mlx_frames`),
so at most one full-resolution frame exists at a time; the processor then finds the frames at its size already
and resizes nothing, giving the same pixels, grid, timestamps and prompt tokens as mlx-vlm's own path
(tests/core/vision/test_video.py checks them against it).

- `probe(path)`: the container's header (OpenCV): size, frame count, frame rate; every bad input is a
  `VideoError` naming the file, before any frame is decoded (missing, a folder, not a video, an unsupported
  codec, no frames, absurd declared dimensions);
- `plan(info, processor, settings)`: which frames are sampled and at what size (no pixels), and what they cost in
  prompt tokens: what the window's strip, the fit and the refusal "only N frames fit" are computed from;
- `decode(path, plan)`: the sampled frames (seeking to each far one, as mlx-vlm does, reading on to a near one: a
  two-hour video is never read whole), with progress, into a `PreparedVideo`.

A `PreparedVideo` is a `PreparedImage` (its poster is the first sampled frame), so it travels every path a picture
takes through the runtime (a turn's "images", the API's pictures, prompt reuse keyed by its digest); only the
vision runner and the chat template look inside it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from macapp.core.vision import mlx_frames
from macapp.core.vision.images import ImageError, PreparedImage

if TYPE_CHECKING:
    import numpy as np
    from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLVideoProcessor

# A frame claiming more than this is refused from the header (8K is 33 megapixels); a decoded frame of that
# size is ~120 MB, held only until it is resized.
MAX_FRAME_PIXELS = 40_000_000
# A sampled frame at most this many seconds after the last one is reached by reading on, not seeking: a seek
# decodes again from the key frame before it (often several seconds back), so a dense sampling seeks once.
READ_ON_S = 2.0
# Besides its video tokens, each pair of frames takes its `<t.t seconds>` and two markers in the prompt: about 7
# tokens (an upper estimate where the tokenizer is not at hand: fits and refusals count with it).
GROUP_MARKS = 8
VIDEO_TYPES = "MP4, MOV, MKV, WebM or AVI"
Progress = Callable[[int, int], None]  # (frames decoded, frames to decode)


class VideoError(ImageError):
    """A video that cannot be used; the message names the file and what to do (an ImageError: every path that
    refuses a bad picture refuses a bad video the same way)."""


@dataclass(frozen=True)
class VideoSettings:
    """What the caller asks of the sampling; None: the model's video processor config, then mlx-vlm's defaults."""

    fps: float | None = None
    max_frames: int | None = None

    def check(self) -> None:
        if self.fps is not None and not self.fps > 0:
            raise ValueError(f"video fps must be more than 0 (got {self.fps})")
        if self.max_frames is not None and self.max_frames < 2:
            raise ValueError(f"video max frames must be at least 2: frames are read in pairs (got {self.max_frames})")


@dataclass(frozen=True)
class ClipInfo:
    """What a video file's header says."""

    name: str
    width: int
    height: int
    total_frames: int
    fps: float  # the source's frame rate

    @property
    def duration_s(self) -> float:
        return self.total_frames / self.fps


@dataclass(frozen=True)
class FramePlan:
    """Which frames of a clip the model sees, at what size, and their timestamps; no pixels."""

    info: ClipInfo
    settings: VideoSettings
    indices: tuple[int, ...]  # source frame numbers, in order
    size: tuple[int, int]  # (width, height) every frame is resized to
    group_seconds: tuple[float, ...]  # the `<t.t seconds>` of each pair of frames
    tokens_per_group: int  # <|video_pad|> tokens per pair of frames

    @property
    def frames(self) -> int:
        return len(self.indices)

    @property
    def video_tokens(self) -> int:
        """The <|video_pad|> tokens (the tower's output), without the timestamps and markers around them."""
        return len(self.group_seconds) * self.tokens_per_group

    @property
    def prompt_cost(self) -> int:
        """About what the video takes of the prompt: its video tokens, and each pair's timestamp and markers."""
        return len(self.group_seconds) * (self.tokens_per_group + GROUP_MARKS)

    def placeholder_text(self, start: str = "<|vision_start|>", end: str = "<|vision_end|>") -> str:
        """What the processor writes for this video in the prompt (mlx-vlm's own rendering)."""
        return mlx_frames.placeholder(list(self.group_seconds), self.tokens_per_group, start, end)


@dataclass(frozen=True, eq=False, kw_only=True)
class PreparedVideo(PreparedImage):
    """A decoded video: its sampled frames at the processor's size (uint8, (T, C, H, W)) and its plan. `image` is the
    first frame (what a list of pictures shows for it)."""

    plan: FramePlan
    pixels: np.ndarray = field(repr=False)
    digest: str  # the sampled frames' pixels, their source positions and rate: what the model reads

    @property
    def metadata(self) -> mlx_frames.VideoMetadata:
        return mlx_frames.metadata(self.plan.info.total_frames, self.plan.info.fps, list(self.plan.indices), self.plan.size)


def probe(path: str | Path) -> ClipInfo:
    """The video's header, or VideoError naming it (nothing decoded)."""
    import cv2

    path = Path(path).expanduser()
    name = str(path)
    if not path.exists():
        raise VideoError(name, "no such file: check the path")
    if path.is_dir():
        raise VideoError(name, "is a folder, not a video")
    if path.stat().st_size == 0:
        raise VideoError(name, "is empty (0 bytes)")
    cap = cv2.VideoCapture(str(path))
    try:
        if not cap.isOpened():
            raise VideoError(name, _unopened(path))
        total = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
        fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0) or 1.0  # mlx-vlm's fallback for a rate the header lacks
        width = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH))
        height = int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
    finally:
        cap.release()
    if total <= 0:
        raise VideoError(name, "has no video frames (0 frames)")
    if width <= 0 or height <= 0:
        raise VideoError(name, "declares no frame size: the file is damaged, or its codec cannot be decoded; convert it to H.264 MP4")
    if width * height > MAX_FRAME_PIXELS:
        raise VideoError(
            name,
            f"declares {width}x{height} frames, more than Qwen Desk decodes ({MAX_FRAME_PIXELS // 1_000_000} megapixels a frame): scale it down first",
        )
    return ClipInfo(name, width, height, total, fps)


def _unopened(path: Path) -> str:
    """Why OpenCV could not open a file: a container it knows holding a codec it cannot decode, or not a video."""
    with path.open("rb") as f:
        head = f.read(64)
    container = None
    if head[4:8] == b"ftyp":
        container = "MP4/MOV"
    elif head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        container = "AVI"
    elif head[:4] == b"\x1a\x45\xdf\xa3":
        container = "Matroska/WebM"
    if container is None:
        return f"is not a video Qwen Desk can read ({VIDEO_TYPES})"
    if container == "MP4/MOV":
        boxes = _mp4_boxes(path)
        if b"moov" not in boxes:
            return "is damaged or cut short (its index, the moov box, is missing): copy or export it again"
        if b"vide" not in path.read_bytes()[: 64 * 1024 * 1024]:
            return "has no video frames (an MP4 with no video track)"
    return f"is a {container} file whose video codec cannot be decoded here: convert it to H.264 MP4 (e.g. ffmpeg -i IN -c:v libx264 OUT.mp4)"


def _mp4_boxes(path: Path) -> set[bytes]:
    """The top-level box types of an MP4/MOV file (read from their headers only)."""
    boxes: set[bytes] = set()
    size = path.stat().st_size
    with path.open("rb") as f:
        at = 0
        while at + 8 <= size:
            f.seek(at)
            head = f.read(16)
            length, kind = int.from_bytes(head[:4], "big"), head[4:8]
            if length == 1 and len(head) == 16:
                length = int.from_bytes(head[8:16], "big")
            elif length == 0:
                length = size - at
            if length < 8:
                break
            boxes.add(kind)
            at += length
    return boxes


def plan(info: ClipInfo, processor: Qwen3VLVideoProcessor, settings: VideoSettings = VideoSettings()) -> FramePlan:
    """The frames the model will see (mlx-vlm's sampling for these settings) and their size; VideoError if the
    processor cannot take the clip's shape."""
    indices = mlx_frames.sample_indices(processor, info.total_frames, info.fps, settings.fps, settings.max_frames)
    if not indices:
        raise VideoError(info.name, f"is too short to sample: {info.total_frames} frame(s), and frames are read in pairs")
    try:
        height, width = mlx_frames.frame_size(processor, len(indices), info.height, info.width)
    except ValueError as exc:
        raise VideoError(info.name, f"has a frame shape the model cannot take ({info.width}x{info.height}: {exc})") from None
    seconds = mlx_frames.group_seconds(processor, info.total_frames, info.fps, list(indices), (width, height))
    per_group = (height // processor.patch_size) * (width // processor.patch_size) // processor.merge_size**2
    return FramePlan(info, settings, tuple(indices), (width, height), tuple(seconds), per_group)


def decode(path: str | Path, frames: FramePlan, progress: Progress | None = None) -> PreparedVideo:
    """The plan's frames, each resized to the plan's size as soon as it is decoded; VideoError when one cannot be
    read (a damaged or cut-short file). `progress(done, total)` after each frame (it may raise to stop)."""
    import cv2
    import numpy as np
    from PIL import Image

    name = frames.info.name
    width, height = frames.size
    pixels = np.empty((frames.frames, 3, height, width), dtype=np.uint8)
    digest = hashlib.sha256(f"video {frames.settings} {frames.info.fps!r} {frames.info.total_frames} {frames.indices} {frames.size}".encode())
    cap = cv2.VideoCapture(str(path))
    try:
        window = max(1, round(frames.info.fps * READ_ON_S))
        at = -1  # the frame number the next read gives (-1: not known until a seek)
        for n, index in enumerate(frames.indices):
            if 0 <= at <= index and index - at <= window:  # near: read on (grab decodes without converting)
                while at < index and cap.grab():
                    at += 1
            else:  # far (or first): seek, as mlx-vlm does; it decodes from the key frame before `index`
                cap.set(cv2.CAP_PROP_POS_FRAMES, index)
                at = index
            ok, bgr = cap.read()
            at = index + 1
            if not ok:
                raise VideoError(name, f"frame {index} of {frames.info.total_frames} could not be decoded: the file is damaged or cut short")
            if bgr.shape[:2] != (frames.info.height, frames.info.width):
                raise VideoError(name, f"frame {index} is {bgr.shape[1]}x{bgr.shape[0]}, not the {frames.info.width}x{frames.info.height} its header declares")
            rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
            del bgr
            pixels[n] = mlx_frames.resize_frame(rgb, height, width)
            digest.update(pixels[n].tobytes())
            if progress is not None:
                progress(n + 1, frames.frames)
    finally:
        cap.release()
    poster = Image.fromarray(np.ascontiguousarray(pixels[0].transpose(1, 2, 0)))
    return PreparedVideo(
        name=name,
        image=poster,
        original_size=(frames.info.width, frames.info.height),
        frames=frames.frames,
        plan=frames,
        pixels=pixels,
        digest="video:" + digest.hexdigest(),
    )


def open_video(
    source: str | Path | bytes,
    processor: Qwen3VLVideoProcessor,
    settings: VideoSettings = VideoSettings(),
    *,
    name: str = "video",
    room: int | None = None,
    progress: Progress | None = None,
) -> PreparedVideo:
    """A video file (or its bytes, e.g. from a data: URL, labelled `name`) → PreparedVideo, or VideoError naming it.
    `room`: the prompt tokens the video may take; when its frames would take more, it is refused before any frame
    is decoded, saying how many frames would fit."""
    if isinstance(source, bytes):
        if not source:
            raise VideoError(name, "is empty (0 bytes)")
        fd, tmp = tempfile.mkstemp(prefix="qwen-desk-video-")  # OpenCV reads files, not bytes
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(source)
            return _relabelled(open_video(tmp, processor, settings, room=room, progress=progress), name)
        except VideoError as exc:
            raise VideoError(name, exc.problem) from None
        finally:
            Path(tmp).unlink(missing_ok=True)
    info = probe(source)
    frames = plan(info, processor, settings)
    if room is not None:
        check_room(frames, processor, room)
    return decode(source, frames, progress)


def _relabelled(video: PreparedVideo, name: str) -> PreparedVideo:
    import dataclasses

    info = dataclasses.replace(video.plan.info, name=name)
    return dataclasses.replace(video, name=name, plan=dataclasses.replace(video.plan, info=info))


def prompt_tokens(frames: FramePlan, tokenizer: Callable[[str], list[int]]) -> int:
    """The prompt tokens the video takes in place of its placeholder (timestamps, markers and video tokens)."""
    return len(tokenizer(frames.placeholder_text()))


def check_room(frames: FramePlan, processor: Qwen3VLVideoProcessor, room: int) -> None:
    """VideoError when the plan's prompt tokens exceed `room`, naming how many frames would fit (before decoding)."""
    if frames.prompt_cost <= room:
        return
    fit = frames_that_fit(frames, processor, room)
    advice = (
        f"at most {fit} frames fit: use --video-max-frames {fit} (API: video_max_frames)"
        if fit
        else "not even 2 frames fit: start a new chat or raise the context"
    )
    raise VideoError(
        frames.info.name,
        f"its {frames.frames} frames would take about {frames.prompt_cost:,} prompt tokens ({frames.video_tokens:,} video tokens), "
        f"more than the {room:,} left in the context; {advice}",
    )


def frames_that_fit(frames: FramePlan, processor: Qwen3VLVideoProcessor, room: int) -> int:
    """The most frames (a multiple of 2, at most the plan's) whose prompt tokens (`FramePlan.prompt_cost`) fit in
    `room`; 0 when none do. Fewer frames may each be larger (the processor's pixel budget spans all frames), so each
    count is sized again."""
    info = frames.info
    for n in range(frames.frames - frames.frames % 2, 1, -2):
        height, width = mlx_frames.frame_size(processor, n, info.height, info.width)
        per_group = (height // processor.patch_size) * (width // processor.patch_size) // processor.merge_size**2
        if -(-n // 2) * (per_group + GROUP_MARKS) <= room:
            return n
    return 0


@dataclass(frozen=True)
class VideoWork:
    """What `frames` frames of a `source`-sized clip cost the model: the frame size the processor gives them, their
    prompt tokens and the tower's activations while it encodes them (all frames at once), for the fit."""

    frames: int
    source: tuple[int, int]
    size: tuple[int, int]  # (width, height) each frame is resized to
    video_tokens: int
    prompt_tokens: int  # with each pair's timestamp and markers (about)
    activation_bytes: int


def video_work(frames: int, processor: Qwen3VLVideoProcessor, source: tuple[int, int], patch_bytes: float) -> VideoWork:
    """The cost of `frames` sampled frames of a `source` (width, height) clip, without a file: the processor's own
    sizing; the tower's activations are `patch_bytes` per patch (they grow with the patches it runs over at once:
    fit.picture_cost's picture at the processor's maximum, divided by its patches)."""
    frames = max(2, frames - frames % 2)
    height, width = mlx_frames.frame_size(processor, frames, source[1], source[0])
    groups = -(-frames // processor.temporal_patch_size)
    per_group = (height // processor.patch_size) * (width // processor.patch_size) // processor.merge_size**2
    patches = groups * (height // processor.patch_size) * (width // processor.patch_size)
    return VideoWork(frames, source, (width, height), groups * per_group, groups * (per_group + GROUP_MARKS), int(patches * patch_bytes))


def most_frames(processor: Qwen3VLVideoProcessor, source: tuple[int, int], room: int, limit: int) -> int:
    """The most frames (at most `limit`) of a `source`-sized clip whose prompt tokens fit in `room`; 0 when none do."""
    info = ClipInfo("", source[0], source[1], max(limit, 2), 1.0)
    whole = FramePlan(info, VideoSettings(), tuple(range(max(limit - limit % 2, 2))), (0, 0), (), 0)
    return frames_that_fit(whole, processor, room)
