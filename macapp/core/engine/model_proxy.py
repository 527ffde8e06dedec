"""The seam other ways of running a model plug into: a proxy the runtime calls as it calls a loaded model.

The runtime (prefill, reply, batch, session) calls a loaded model the way mlx-lm does: ``model(tokens,
cache=, input_embeddings=)`` → logits, and ``model.make_cache()``. A `ModelProxy` stands in for the model and
runs each call its own way (several Macs: macapp.core.cluster.lockstep.LockstepModel broadcasts every call to
the other Macs first and keeps their caches in step through the caches' mirror, engine/positions.py). The
runtime never knows which proxy it holds: it asks the proxy what it can run (`runs_pictures`) and closes it
with the engine (`close`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from macapp.core.cache_layers import CacheLayers

if TYPE_CHECKING:  # naming MLX's types costs nothing at start-up
    import mlx.core as mx
    import mlx.nn as nn


class ModelProxy:
    """A loaded model as the runtime calls it, run elsewhere or otherwise. Subclasses implement the calls."""

    runs_pictures: bool = True  # False: turns and requests with pictures are refused (pictures_refusal says why)
    pictures_refusal: str = "Pictures are not supported by this model."

    @property
    def inner(self) -> "nn.Module":
        """The model the calls end up in (this process's part of it)."""
        raise NotImplementedError

    def make_cache(self) -> CacheLayers:
        raise NotImplementedError

    def __call__(self, inputs: "mx.array", cache: CacheLayers | None = None, input_embeddings: "mx.array | None" = None) -> "mx.array":
        raise NotImplementedError

    def close(self) -> None:
        """The engine is closing (on its worker, after its jobs): end whatever the proxy runs besides this process."""


def pictures_refusal(model: object) -> str | None:
    """Why a loaded model's `model` cannot run pictures because of how it is run (None: nothing stops it)."""
    if isinstance(model, ModelProxy) and not model.runs_pictures:
        return model.pictures_refusal
    return None


def close_proxy(model: object) -> None:
    """Close `model` if it is a proxy (Engine.close, on the worker)."""
    if isinstance(model, ModelProxy):
        model.close()
