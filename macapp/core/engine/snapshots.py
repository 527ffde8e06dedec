"""Points in a prompt cache to come back to, without copying anything.

Qwen3.5 mixes two kinds of layer, and mlx-lm's cache protocol covers both: a full-attention layer's KV cache
only grows and is trimmable (`is_trimmable()`, `trim(n)`), so a snapshot keeps its length; a Gated DeltaNet
layer's `ArraysCache` replaces its state arrays on every step instead of writing into them, so a snapshot
keeps references to them (`state`) and restoring puts them back. Nothing is copied; a snapshot keeps the
DeltaNet arrays of its point alive (`CacheSnapshot.nbytes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from macapp.core.cache_layers import CacheLayers

if TYPE_CHECKING:
    import mlx.core as mx

    from macapp.core.engine.checkpoints import Checkpoint


class CacheMirror(Protocol):
    """What repeats a prompt cache's marks and checkpoints elsewhere: several Macs keep every rank's cache in step
    with rank 0's (macapp.core.cluster.lockstep). One hook for both: snapshots here, checkpoints in checkpoints.py
    (taken, moved by the API's pool onto a newer KV block, restored into a fresh cache, which it returns)."""

    def snapshot_taken(self, cache: "ObservedCache", snap: "CacheSnapshot") -> None: ...

    def snapshot_restored(self, cache: "ObservedCache", snap: "CacheSnapshot") -> None: ...

    def checkpoint_taken(self, cache: "ObservedCache", checkpoint: Checkpoint) -> None: ...

    def checkpoint_moved(self, old: Checkpoint, onto: Checkpoint, moved: Checkpoint) -> None: ...

    def checkpoint_restored(self, checkpoint: Checkpoint, layers: CacheLayers) -> CacheLayers: ...


class ObservedCache(CacheLayers):
    """A prompt cache (mlx-lm's list of layers) with a `mirror` told of its snapshots and checkpoints."""

    mirror: CacheMirror | None = None


@dataclass(frozen=True)
class KVLength:
    """A trimmable (KV) layer at a snapshot: its length then."""

    offset: int


@dataclass(frozen=True)
class ArraysState:
    """An ArraysCache (DeltaNet) layer at a snapshot: its `state` then (the arrays, never written in place)."""

    arrays: tuple[mx.array | None, ...]  # None: a slot the model has not filled yet
    left_padding: mx.array | None
    lengths: mx.array | None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays if a is not None)


@dataclass(frozen=True)
class CacheSnapshot:
    """A point in a session's cache: `length` tokens, and each layer as it was then."""

    length: int
    layers: tuple[KVLength | ArraysState, ...]

    @property
    def nbytes(self) -> int:
        """Memory this snapshot keeps alive (the DeltaNet states of its point)."""
        return sum(layer.nbytes for layer in self.layers if isinstance(layer, ArraysState))


def take_snapshot(cache: CacheLayers, length: int) -> CacheSnapshot:
    """Remember where `cache` (holding `length` tokens) is now; TypeError for a layer that cannot come back."""
    from mlx_lm.models.cache import ArraysCache

    layers: list[KVLength | ArraysState] = []
    for layer in cache:
        if isinstance(layer, ArraysCache):
            arrays, left_padding, lengths = layer.state
            layers.append(ArraysState(tuple(arrays), left_padding, lengths))  # the list is mutable: keep its items
        elif layer.is_trimmable():
            layers.append(KVLength(int(layer.offset)))
        else:  # pragma: no cover - a cache type Qwen3.5 does not use (a full RotatingKVCache, ...)
            raise TypeError(f"cannot snapshot a {type(layer).__name__}")
    snap = CacheSnapshot(length, tuple(layers))
    if isinstance(cache, ObservedCache) and cache.mirror is not None:
        cache.mirror.snapshot_taken(cache, snap)
    return snap


def restore_snapshot(cache: CacheLayers, snap: CacheSnapshot) -> None:
    """Put `cache` back where `snap` was taken. KV layers only grew since (they may have been quantized in
    between: a trim works on either kind); DeltaNet layers get their old arrays back."""
    for layer, then in zip(cache, snap.layers, strict=True):
        match then:
            case KVLength(offset):
                layer.trim(layer.offset - offset)
            case ArraysState(arrays, left_padding, lengths):
                layer.state = (list(arrays), left_padding, lengths)
    if isinstance(cache, ObservedCache) and cache.mirror is not None:
        cache.mirror.snapshot_restored(cache, snap)
