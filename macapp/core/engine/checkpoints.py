"""Checkpoints: a prompt cache's state at a token prefix, kept without copying anything, and restored into a fresh cache.

The records the API's pool keeps (macapp.core.serving.pool) and PromptCache takes and restores (prompt_cache.py).
What a checkpoint holds, without copying anything at the time:
- full-attention layers (mlx-lm KVCache / QuantizedKVCache): views of their key/value buffers up to the
  offset. The live cache goes on writing into its buffer in place, but MLX never writes into a buffer that
  another array still shares, so its next write copies the buffer and the view keeps the old contents
  (a checkpoint costs one buffer copy, deferred). A restored cache gets new views of them and grows by
  concatenation into a buffer of its own, so the checkpoint is never written either.
- DeltaNet layers (ArraysCache): references to their conv and recurrent state arrays, which the model
  replaces on every step rather than writing (as the engine's snapshots rely on).

Several Macs: a checkpoint of a cache that is mirrored on other ranks (an ObservedCache with a `mirror`,
macapp.core.cluster.lockstep) keeps that mirror and tells it of what is done with its arrays here: taken, moved
onto a newer KV block (by the pool), restored into a fresh cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence, cast

from macapp.core.cache_layers import CacheLayers
from macapp.core.engine.snapshots import CacheMirror, ObservedCache

if TYPE_CHECKING:  # where a picture's tokens sit in a cache (vision.runner imports MLX: for the type only)
    import mlx.core as mx

    from macapp.core.engine.mtp_context import HeadCheckpoint
    from macapp.core.vision.runner import PictureSpan

    KVArrays = mx.array | tuple[mx.array, ...]  # a KV layer's keys or values (QuantizedKVCache: data, scales, biases)

Key = tuple[int | str, ...]  # token ids; a picture's image tokens are its digest (macapp.core.serving.pictures)


@dataclass(frozen=True)
class KVBuffers:
    """A full-attention layer's key/value buffers (a tuple of arrays each when quantized)."""

    cls: type  # KVCache or QuantizedKVCache
    keys: KVArrays
    values: KVArrays
    quantization: tuple[int, int] | None  # (group_size, bits) of a QuantizedKVCache


@dataclass(eq=False)
class KVBlock:
    """The KV buffers of every full-attention layer, holding `length` tokens; shared by the checkpoints of one
    token prefix (each reads the first `Checkpoint.length` positions)."""

    layers: tuple[KVBuffers, ...]
    length: int
    nbytes: int


@dataclass(frozen=True)
class KVLayer:
    index: int  # into KVBlock.layers


@dataclass(frozen=True)
class RecurrentState:
    cls: type  # ArraysCache
    arrays: tuple[mx.array | None, ...]


Layer = KVLayer | RecurrentState


@dataclass(frozen=True)
class Checkpoint:
    tokens: Key
    layers: tuple[Layer, ...]  # the cache's layers in order
    kv: KVBlock
    state_bytes: int  # the DeltaNet arrays this checkpoint alone keeps
    spans: tuple[PictureSpan, ...] = field(default=(), compare=False)  # the pictures among `tokens` (prompt_cache.py)
    mirror: CacheMirror | None = field(default=None, compare=False, repr=False)
    head: HeadCheckpoint | None = field(default=None, compare=False, repr=False)  # the MTP head's context (mtp_context.py)

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def rope_delta(self) -> int:
        """The next token's position minus `length`: what the pictures before it moved (< 0 after one, else 0)."""
        return sum(span.delta for span in self.spans)


def _views(x: KVArrays, offset: int) -> KVArrays:
    if isinstance(x, (tuple, list)):
        return tuple(a[..., :offset, :] for a in x)
    return x[..., :offset, :]


def _arrays(x: KVArrays) -> list[mx.array]:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def snapshot(cache: CacheLayers, tokens: Sequence[int | str], spans: Sequence[PictureSpan] = (), head: HeadCheckpoint | None = None) -> Checkpoint:
    """A checkpoint of a live prompt cache that holds exactly `tokens` (a Key) and the pictures `spans` among them
    (`head`: the MTP head's context over them, whose bytes count with the DeltaNet state's)."""
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache

    layers: list[Layer] = []
    buffers: list[KVBuffers] = []
    kv_bytes = state_bytes = 0
    for c in cache:
        if isinstance(c, (KVCache, QuantizedKVCache)):
            if c.keys is None or c.offset != len(tokens):
                raise ValueError(f"a KV layer holds {c.offset} tokens, not the {len(tokens)} of the checkpoint")
            quant = (c.group_size, c.bits) if isinstance(c, QuantizedKVCache) else None
            keys, values = cast("KVArrays", c.keys), cast("KVArrays", c.values)  # mlx-lm types them as the Nones they start as
            layers.append(KVLayer(len(buffers)))
            buffers.append(KVBuffers(type(c), _views(keys, c.offset), _views(values, c.offset), quant))
            kv_bytes += sum(a.nbytes for a in _arrays(keys) + _arrays(values))
        elif isinstance(c, ArraysCache):
            if c.lengths is not None or c.left_padding is not None:
                raise ValueError("cannot checkpoint a batched DeltaNet cache")
            arrays: tuple[mx.array | None, ...] = tuple(c.cache)  # mlx-lm types its slots as the Nones they start as
            layers.append(RecurrentState(type(c), arrays))
            state_bytes += sum(a.nbytes for a in arrays if a is not None)
        else:
            raise TypeError(f"cannot checkpoint a {type(c).__name__} layer")
    mx.eval([a for b in buffers for a in _arrays(b.keys) + _arrays(b.values)])
    observed = cache if isinstance(cache, ObservedCache) else None
    mirror = observed.mirror if observed is not None else None
    kv = KVBlock(tuple(buffers), len(tokens), kv_bytes)
    if head is not None:
        state_bytes += head.nbytes
    checkpoint = Checkpoint(tuple(tokens), tuple(layers), kv, state_bytes, tuple(spans), mirror, head)
    if observed is not None and mirror is not None:
        mirror.checkpoint_taken(observed, checkpoint)
    return checkpoint


def restore(checkpoint: Checkpoint) -> CacheLayers:
    """A fresh prompt cache at the checkpoint: the model may append to it without touching the checkpoint."""
    n = checkpoint.length
    cache: CacheLayers = []
    for layer in checkpoint.layers:
        if isinstance(layer, KVLayer):
            buf = checkpoint.kv.layers[layer.index]
            c = buf.cls(*buf.quantization) if buf.quantization is not None else buf.cls()
            c.keys = _views(buf.keys, n)  # new array objects: writes to them never reach ours
            c.values = _views(buf.values, n)
            c.offset = n
        else:
            c = layer.cls(len(layer.arrays))
            c.cache = list(layer.arrays)
        cache.append(c)
    return checkpoint.mirror.checkpoint_restored(checkpoint, cache) if checkpoint.mirror is not None else cache
