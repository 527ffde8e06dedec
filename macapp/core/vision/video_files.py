"""A sent video as the history keeps it: its sampled frames at the processor's size and their plan (an .npz), so
a reopened conversation shows the same strip and the model reads the very same frames, without the source file."""

from __future__ import annotations

import dataclasses
import io
import json

from macapp.core.vision.images import ImageError
from macapp.core.vision.video import ClipInfo, FramePlan, PreparedVideo, VideoSettings


def to_bytes(video: PreparedVideo) -> bytes:
    plan = video.plan
    meta = {
        "info": dataclasses.asdict(plan.info),
        "settings": dataclasses.asdict(plan.settings),
        "indices": list(plan.indices),
        "size": list(plan.size),
        "group_seconds": list(plan.group_seconds),
        "tokens_per_group": plan.tokens_per_group,
        "digest": video.digest,
    }
    import numpy as np

    buffer = io.BytesIO()
    np.savez_compressed(buffer, pixels=video.pixels, meta=np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8))
    return buffer.getvalue()


def from_bytes(data: bytes, name: str) -> PreparedVideo:
    """The stored video again; ImageError when the file is damaged."""
    import numpy as np
    from PIL import Image

    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as stored:
            pixels = stored["pixels"]
            meta = json.loads(stored["meta"].tobytes().decode())
        info = ClipInfo(**meta["info"])
        plan = FramePlan(
            info=info,
            settings=VideoSettings(**meta["settings"]),
            indices=tuple(int(i) for i in meta["indices"]),
            size=(int(meta["size"][0]), int(meta["size"][1])),
            group_seconds=tuple(float(s) for s in meta["group_seconds"]),
            tokens_per_group=int(meta["tokens_per_group"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ImageError(name, f"its stored frames are damaged ({exc})") from None
    poster = Image.fromarray(np.ascontiguousarray(pixels[0].transpose(1, 2, 0)))
    return PreparedVideo(
        name=name, image=poster, original_size=(info.width, info.height), frames=plan.frames, plan=plan, pixels=pixels, digest=str(meta["digest"])
    )
