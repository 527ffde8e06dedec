"""Where pictures put the mRoPE positions in a prompt cache: `PictureSpan`. No MLX import (its positions are an
array it only slices), so the engine's positions and prompt cache name it without loading the vision runner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import mlx.core as mx


@dataclass(frozen=True, eq=False)  # its positions are an array: compared by identity
class PictureSpan:
    """A prompt read with explicit positions (a turn with pictures): cache indices [start, end). A PromptCache keeps
    them (engine/prompt_cache.py), and so do its checkpoints: the one record of where pictures put the positions."""

    start: int
    end: int
    positions: mx.array  # (3, 1, end - start), absolute
    delta: int  # how far it moved later positions behind the token count
    base: int = 0  # the position its first token would have without it (start + the deltas of the spans before)

    def until(self, end: int) -> PictureSpan:
        """This span cut at cache index `end` (a checkpoint there: a boundary, never inside a picture)."""
        if end >= self.end:
            return self
        k = end - self.start
        positions = self.positions[..., :k]
        return PictureSpan(self.start, end, positions, int(positions.max()) + 1 - self.base - k, self.base)
