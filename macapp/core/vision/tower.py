"""The vision tower as a capability of one loaded model: attached on first use, kept as long as the model is.

A `TowerSlot` is part of the loaded model (engine/model_folder.LoadedModel.tower), shared by every view of it
(`dataclasses.replace` copies the slot, not the tower), so the tower goes when the model does: no module
global, nothing to drop by hand. mlx-vlm is imported only when a tower is attached (vision.runner)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import mlx.nn as nn

    from macapp.core.vision.runner import VisionModel


class TowerSlot:
    """Where a loaded model keeps its vision tower once a picture needs it."""

    def __init__(self) -> None:
        self.vision: "VisionModel | None" = None

    def attach(self, text_model: nn.Module, path: str | Path) -> "VisionModel":
        """The tower, attached now unless it already is (vision.runner.attach_vision; vision.capability.VisionLoadError)."""
        if self.vision is None:
            from macapp.core.vision.runner import attach_vision  # why: runner imports mlx-vlm; loading a model must not

            self.vision = attach_vision(text_model, path)
        return self.vision

    @property
    def attached_bytes(self) -> int:
        """The tower's bytes once attached (it stays in memory for the model's lifetime), else 0."""
        return self.vision.vision_bytes if self.vision is not None else 0
