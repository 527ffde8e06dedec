"""Which builds can see: a `vision_config` in config.json AND the vision tower's weights in the files.

Every Qwen3.5 checkpoint is vision-language, but some MLX conversions drop the tower (the 397B-A17B 4-bit card
says text-only) while keeping `vision_config`; so the config alone is not enough. The tower's tensors are
``vision_tower.*`` (MLX layout), ``model.visual.*`` or ``model.language_model.visual.*`` (Hugging Face layouts), as
`macapp.core.tensor_roles` says for every caller; their exact bytes come from the safetensors headers (no tensor data is read).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from macapp.core.jsonvalue import JSONObject
from macapp.core.modelfiles import SafetensorsError, read_safetensors_header
from macapp.core.tensor_roles import is_tower_tensor

__all__ = [
    "VisionSupport",
    "TEXT_ONLY",
    "has_vision_config",
    "support_from_tensors",
    "folder_tensors",
    "index_tensor_names",
    "folder_support",
    "text_only_message",
    "is_tower_tensor",
    "VisionLoadError",
]


class VisionLoadError(RuntimeError):
    """A build that sees whose tower could not be attached (vision.runner.attach_vision): files that do not match."""


@dataclass(frozen=True)
class VisionSupport:
    """What a build's files say about images."""

    has_vision_config: bool
    tower_tensors: int  # how many tower tensors the weights hold
    tower_bytes: int  # their bytes (exact, from the headers), 0 when none
    exact: bool = True  # False when the bytes came from elsewhere than the headers

    @property
    def sees(self) -> bool:
        return self.has_vision_config and self.tower_tensors > 0

    @property
    def why_not(self) -> str:
        """A short reason a build is text-only ('' when it sees)."""
        if self.sees:
            return ""
        if not self.has_vision_config:
            return "its config.json has no vision_config"
        return "its weights hold no vision tower (a text-only conversion)"


TEXT_ONLY = VisionSupport(has_vision_config=False, tower_tensors=0, tower_bytes=0)


def has_vision_config(config: JSONObject) -> bool:
    return isinstance(config.get("vision_config"), dict) and bool(config["vision_config"])


def support_from_tensors(config: JSONObject, tensors: Iterable[tuple[str, int]]) -> VisionSupport:
    """From (tensor name, bytes) pairs, e.g. a hub repo's safetensors metadata."""
    count = 0
    total = 0
    for name, nbytes in tensors:
        if is_tower_tensor(name):
            count += 1
            total += int(nbytes)
    return VisionSupport(has_vision_config(config), count, total)


def folder_tensors(folder: Path) -> list[tuple[str, int]]:
    """(name, bytes) of every tensor in a folder's safetensors files, from their headers."""
    out: list[tuple[str, int]] = []
    for path in sorted(Path(folder).glob("*.safetensors")):
        out.extend((name, end - start) for name, (start, end) in read_safetensors_header(path).tensors.items())
    return out


def index_tensor_names(folder: Path) -> list[str]:
    """Tensor names from model.safetensors.index.json (the weight map), [] when there is none."""
    index = Path(folder) / "model.safetensors.index.json"
    try:
        weight_map = json.loads(index.read_text()).get("weight_map") or {}
    except (OSError, ValueError, AttributeError):
        return []
    return list(weight_map) if isinstance(weight_map, dict) else []


def folder_support(folder: Path) -> VisionSupport:
    """A local model folder: config.json plus the tower's bytes from the headers (the index when they are unreadable)."""
    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return TEXT_ONLY
    if not isinstance(config, dict):
        return TEXT_ONLY
    try:
        return support_from_tensors(config, folder_tensors(folder))
    except (OSError, SafetensorsError):
        names = [n for n in index_tensor_names(folder) if is_tower_tensor(n)]
        return VisionSupport(has_vision_config(config), len(names), 0, exact=False)


def text_only_message(build: str, alternative: str | None = None) -> str:
    """What to tell someone who gave a picture to a text-only build."""
    if alternative:
        use = f"use {alternative} (or any build marked 'images' in `qwen-desk models` and the library)"
    else:
        use = "use a build marked 'images' in `qwen-desk models` (or the library)"
    return f"{build}: this build is text-only: {use}, or send the message without pictures."
