"""mlx-vlm's video path, piece by piece (its private steps come through macapp.core.upstream.qwen_vl_video).

mlx-vlm does a clip in one call (`load_video`: every sampled frame decoded at full size; then the processor
resizes them all); vision.video runs the same steps one frame at a time so a 4K clip never sits in memory whole.
Each function here is mlx-vlm's own code for its step (its sampling settings and defaults, its frame sizing, its
bicubic resize, its timestamps and prompt text), except `sample_indices`, which repeats `load_video`'s index
arithmetic because that function decodes the frames in the same breath (tests/core/vision/test_video.py holds the
two equal). mlx-vlm is imported on first use only.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from macapp.core.upstream import qwen_vl_video

if TYPE_CHECKING:
    import numpy as np
    from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLVideoProcessor
    from mlx_vlm.utils import VideoMetadata

__all__ = ["VideoMetadata", "video_processor", "sample_indices", "frame_size", "resize_frame", "group_seconds", "placeholder", "metadata"]


@functools.lru_cache(maxsize=4)
def video_processor(folder: str | Path) -> Qwen3VLVideoProcessor:
    """The model folder's video processor, configured as mlx-vlm's Qwen3VLProcessor.from_pretrained does it
    (video_preprocessor_config.json, else preprocessor_config.json); no tokenizer, no MLX."""
    from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLVideoProcessor

    return Qwen3VLVideoProcessor(**qwen_vl_video().video_kwargs(str(folder), default_patch_size=16))


def sample_indices(processor: Qwen3VLVideoProcessor, total: int, source_fps: float, fps: float | None, max_frames: int | None) -> list[int]:
    """The source frame numbers mlx-vlm's `load_video` samples for these settings ([] when it would refuse the clip:
    fewer frames than a pair)."""
    import numpy as np
    from mlx_vlm.utils import resolve_video_sampling

    overrides: dict[str, float | int] = {}
    if fps is not None:
        overrides["fps"] = fps
    if max_frames is not None:
        overrides["max_frames"] = max_frames
    sampling = resolve_video_sampling(SimpleNamespace(video_processor=processor), overrides)
    # merged over DEFAULT_VIDEO_SAMPLING: none is None
    assert sampling.frame_factor and sampling.min_frames is not None and sampling.max_frames is not None and sampling.fps is not None
    factor = int(sampling.frame_factor)
    lo = math.ceil(sampling.min_frames / factor) * factor
    hi = math.floor(min(sampling.max_frames, total) / factor) * factor
    n = min(max(total / source_fps * sampling.fps, lo), hi, total)
    n = math.floor(n / factor) * factor
    if not factor <= n <= total:
        return []
    indices: list[int] = np.linspace(0, total - 1, n).round().astype(int).tolist()
    return indices


def frame_size(processor: Qwen3VLVideoProcessor, frames: int, height: int, width: int) -> tuple[int, int]:
    """(height, width) the processor resizes `frames` frames of height x width to (its pixel budget spans them all);
    ValueError for a shape it refuses (a side under 32 pixels, an aspect ratio over 200)."""
    size: tuple[int, int] = qwen_vl_video().smart_resize(
        num_frames=frames,
        height=height,
        width=width,
        temporal_factor=processor.temporal_patch_size,
        factor=processor.patch_size * processor.merge_size,
        min_pixels=processor.min_pixels,
        max_pixels=processor.max_pixels,
    )
    return size


def resize_frame(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """One decoded (H, W, 3) uint8 frame → (3, height, width), by the processor's own resize (PIL bicubic)."""
    frame: np.ndarray = qwen_vl_video().resize_frames(rgb.transpose(2, 0, 1)[None], height, width)[0]
    return frame


def metadata(total: int, source_fps: float, indices: list[int], size: tuple[int, int]) -> VideoMetadata:
    """What mlx-vlm's `load_video` reports beside the frames (the processor's timestamps come from it)."""
    from mlx_vlm.utils import VideoMetadata

    return VideoMetadata(
        total_num_frames=total,
        fps=source_fps,
        frames_indices=list(indices),
        width=size[0],
        height=size[1],
        duration=total / source_fps,
    )


def group_seconds(processor: Qwen3VLVideoProcessor, total: int, source_fps: float, indices: list[int], size: tuple[int, int]) -> list[float]:
    """The `<t.t seconds>` of each pair of frames: the mean of the pair's source times (an odd last frame repeated)."""
    tps = processor.temporal_patch_size
    seconds: list[float] = qwen_vl_video().group_timestamps(-(-len(indices) // tps), tps, source_fps, metadata(total, source_fps, indices, size))
    return seconds


def placeholder(seconds: list[float], tokens_per_group: int, start: str, end: str, pad: str = "<|video_pad|>") -> str:
    """The prompt text the processor puts in place of `<|vision_start|><|video_pad|><|vision_end|>`."""
    text: str = qwen_vl_video().timestamped_placeholder(seconds, tokens_per_group, start, end)
    return text.replace("<|placeholder|>", pad)
