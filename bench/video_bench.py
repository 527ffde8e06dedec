"""Video benchmark (run by hand): what a video costs per frame, and what decoding a 4K clip holds in memory.

    .venv/bin/python bench/video_bench.py [--seconds 60] [--source-fps 5] > /tmp/video_bench.md

1. The tiny vision model (tests' tiny Qwen3.5 with a tower) through the real engine: for 4, 8, 16 and 32 sampled
   frames of a 64x64 clip, the decode time (vision.video.open_video), the turn's time to first token (the tower
   and the prompt) and its prompt tokens; per frame.
2. Peak RSS of a fresh process decoding a clip made here (OpenCV, mp4v) of `--seconds` seconds at 3840x2160
   versus 640x360, with Qwen3-VL's own video processor settings (2 fps, up to 768 frames, a 25,165,824-pixel
   budget): each sampled frame is resized as soon as it is decoded, so the 4K clip should cost about one 4K
   frame more than the 360p one, not its frames (mlx-vlm's `load_video` keeps them all at full size: 120 frames
   x 24.9 MB = 3 GB here, not run on this shared machine).

Prints a Markdown section for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures.video import write_video  # noqa: E402

DECODE = """
import resource, sys, time
sys.path.insert(0, {root!r})
from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLVideoProcessor
from macapp.core.vision.video import open_video
processor = Qwen3VLVideoProcessor(patch_size=16, temporal_patch_size=2, merge_size=2, min_pixels=4096, max_pixels=25165824, fps=2, min_frames=4, max_frames=768)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
video = open_video({path!r}, processor)
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter() - start, video.plan.frames, video.plan.size, video.pixels.nbytes)
"""


def per_frame(tmp: Path) -> list[str]:
    from macapp.core.engine import Engine
    from macapp.core.sampling import greedy
    from macapp.core.vision import mlx_frames
    from macapp.core.vision.video import VideoSettings, open_video
    from macapp.core.demo.tiny_vlm import make_tiny_vlm

    model = make_tiny_vlm(tmp / "tiny-vl")
    processor = mlx_frames.video_processor(model)
    clip = write_video(tmp / "clip.mp4", size=(64, 64), frames=320, fps=10.0)  # 32 s
    engine = Engine()
    engine.load(str(model)).result(timeout=120)
    rows = ["| frames | decode s | TTFT s | prompt tokens | video tokens | decode ms / frame | prompt tokens / frame |", "|---|---|---|---|---|---|---|"]
    try:
        engine.new_session().send("warm up", thinking=False, sampling=greedy(1)).result(timeout=120)
        for frames in (4, 8, 16, 32):
            settings = VideoSettings(fps=8.0, max_frames=frames)
            start = time.perf_counter()
            video = open_video(clip, processor, settings)
            decode_s = time.perf_counter() - start
            reply = engine.new_session().send("what moves?", thinking=False, sampling=greedy(1), images=[video]).result(timeout=300)
            st = reply.stats
            rows.append(
                f"| {video.plan.frames} | {decode_s:.3f} | {st.ttft_s:.3f} | {st.prompt_tokens} | {st.image_tokens} | "
                f"{decode_s / video.plan.frames * 1000:.1f} | {st.prompt_tokens / video.plan.frames:.1f} |"
            )
    finally:
        engine.close()
    return rows


def peak_rss(tmp: Path, seconds: int, source_fps: float) -> list[str]:
    rows = [
        "| clip | file MB | make s | sampled frames | frame size | frames held MB | decode s | peak RSS MB (process) | RSS added by decoding MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, size in (("360p", (640, 360)), ("4K", (3840, 2160))):
        start = time.perf_counter()
        path = write_video(tmp / f"{label}.mp4", size=size, frames=int(seconds * source_fps), fps=source_fps)
        made = time.perf_counter() - start
        code = DECODE.format(root=str(Path(__file__).resolve().parents[1]), path=str(path))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
        before, after, decode_s, frames = int(out[0]), int(out[1]), float(out[2]), int(out[3])
        held = int(out[-1])
        shape = " ".join(out[4:-1])
        rows.append(
            f"| {seconds} s {label} {size[0]}x{size[1]} | {path.stat().st_size / 1e6:.1f} | {made:.1f} | {frames} | {shape} | {held / 1e6:.1f} | "
            f"{decode_s:.1f} | {after / 1024:.0f} | {(after - before) / 1024:.0f} |"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--source-fps", type=float, default=5.0, help="the made clips' frame rate (kept low: writing 4K mp4v is slow)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        frames = per_frame(Path(tmp))
        memory = peak_rss(Path(tmp), args.seconds, args.source_fps)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"### {when}: video (bench/video_bench.py), {platform.machine()} {platform.system()} {resource.getpagesize() and ''}2-core VM, CPU MLX\n")
    print("Per frame, the tiny vision model (64x64 clip, greedy, one token):\n")
    print("\n".join(frames))
    print(f"\nPeak RSS decoding a {args.seconds} s clip ({args.source_fps:g} fps source, made here) with Qwen3-VL's video processor settings:\n")
    print("\n".join(memory))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
