"""Prompt checkpoints: cache snapshots at message boundaries, shared by every API request, bounded in bytes.

Agents resend the whole conversation with each request, and Qwen3.5's DeltaNet layers cannot be trimmed back
to a shorter prefix, so the runner snapshots the cache at the boundaries render.py names while it reads a
prompt; the next request restores the longest stored prefix of its own tokens into a fresh cache and reads
only the rest.

What a snapshot holds, without copying anything at the time:
- full-attention layers (mlx-lm KVCache / QuantizedKVCache): views of their key/value buffers up to the
  offset. The live cache goes on writing into its buffer in place, but MLX never writes into a buffer that
  another array still shares, so its next write copies the buffer and the view keeps the old contents
  (a snapshot costs one buffer copy, deferred). A restored cache gets new views of them and grows by
  concatenation into a buffer of its own, so the checkpoint is never written either.
- DeltaNet layers (ArraysCache): references to their conv and recurrent state arrays, which the model
  replaces on every step rather than writing (as the engine's own snapshots rely on).

One conversation, one KV buffer: a new checkpoint's KV buffers hold every shorter checkpoint of the same token
prefix too, so those are moved onto views of the newest one and their own buffers are freed (the positions
they share hold the same keys and values: the same tokens, read once and then copied along). A conversation
of many checkpoints thus keeps one KV cache and one DeltaNet state per checkpoint.

Size: the bytes of the buffers the pool keeps alive, each shared buffer counted once (a KV buffer in full:
mlx-lm allocates in steps of 256 tokens). Beyond `max_bytes` the least recently used checkpoints go first. A request that finds its
prefixes refreshes them longest first, so within a conversation the shortest ones (the system prompt and
tools, shared by every conversation of an agent) are the last to go, and checkpoints of other conversations
go before any of this one's.

Keys: a prompt's tokens, except that a picture's image tokens (all one placeholder id) are keyed by the picture's
content digest (macapp.core.vision.serving), so a prefix matches only with the same pictures in the same places.
A checkpoint after a picture also keeps `rope_delta`: how far the picture's compact mRoPE positions pulled the
positions behind the token count, which the reading of the rest goes on from.

Several Macs: a checkpoint of a cache that is mirrored on other ranks (an ObservedCache whose
`checkpoint_mirror()` is not None, macapp.core.cluster.lockstep) keeps that mirror, and tells it of the three
things done with its arrays here: taken, moved onto a newer KV block, restored into a fresh cache. Dropping
one (eviction, clear) is the mirror's to notice (it goes when the checkpoint is no longer referenced).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, Sequence

from macapp.core.engine.snapshots import ObservedCache

Key = tuple[int | str, ...]  # token ids; a picture's image tokens are its digest (see the module docstring)


@dataclass(frozen=True)
class KVBuffers:
    """A full-attention layer's key/value buffers (a tuple of arrays each when quantized)."""

    cls: type  # KVCache or QuantizedKVCache
    keys: Any
    values: Any
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
    arrays: tuple[Any, ...]


Layer = KVLayer | RecurrentState


@dataclass(frozen=True)
class Checkpoint:
    tokens: Key
    layers: tuple[Layer, ...]  # the cache's layers in order
    kv: KVBlock
    state_bytes: int  # the DeltaNet arrays this checkpoint alone keeps
    rope_delta: int = 0  # the next token's position minus `length` (< 0 after a picture, else 0)
    mirror: "CheckpointMirror | None" = field(default=None, compare=False, repr=False)

    @property
    def length(self) -> int:
        return len(self.tokens)


class CheckpointMirror(Protocol):
    """Repeats what the pool does with a checkpoint's arrays on the other ranks of a cluster (see the docstring)."""

    def checkpoint_taken(self, cache: list, checkpoint: Checkpoint) -> None: ...

    def checkpoint_moved(self, old: Checkpoint, onto: Checkpoint, moved: Checkpoint) -> None: ...

    def checkpoint_restored(self, checkpoint: Checkpoint, layers: list) -> list: ...


def _views(x: Any, offset: int) -> Any:
    if isinstance(x, (tuple, list)):
        return tuple(a[..., :offset, :] for a in x)
    return x[..., :offset, :]


def _arrays(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def snapshot(cache: list, tokens: Sequence[int | str], rope_delta: int = 0) -> Checkpoint:
    """A checkpoint of a live prompt cache that holds exactly `tokens` (a Key), read up to positions `rope_delta` behind."""
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
            layers.append(KVLayer(len(buffers)))
            buffers.append(KVBuffers(type(c), _views(c.keys, c.offset), _views(c.values, c.offset), quant))
            kv_bytes += sum(a.nbytes for a in _arrays(c.keys) + _arrays(c.values))
        elif isinstance(c, ArraysCache):
            if c.lengths is not None or c.left_padding is not None:
                raise ValueError("cannot checkpoint a batched DeltaNet cache")
            arrays = tuple(c.cache)
            layers.append(RecurrentState(type(c), arrays))
            state_bytes += sum(a.nbytes for a in arrays if a is not None)
        else:
            raise TypeError(f"cannot checkpoint a {type(c).__name__} layer")
    mx.eval([a for b in buffers for a in _arrays(b.keys) + _arrays(b.values)])
    mirror = cache.checkpoint_mirror() if isinstance(cache, ObservedCache) else None
    kv = KVBlock(tuple(buffers), len(tokens), kv_bytes)
    checkpoint = Checkpoint(tuple(tokens), tuple(layers), kv, state_bytes, rope_delta, mirror)
    if mirror is not None:
        mirror.checkpoint_taken(cache, checkpoint)
    return checkpoint


def restore(checkpoint: Checkpoint) -> list:
    """A fresh prompt cache at the checkpoint: the model may append to it without touching the checkpoint."""
    n = checkpoint.length
    cache: list = []
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


class CheckpointPool:
    """Checkpoints keyed by their token prefix, least recently used first out. Use on the engine's worker only."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max(0, int(max_bytes))
        self.owner: Any = None  # what the checkpoints belong to (the loaded model); see bind()
        self._entries: collections.OrderedDict[Key, Checkpoint] = collections.OrderedDict()
        self._blocks: dict[int, tuple[KVBlock, int]] = {}  # id -> (block, checkpoints using it)
        self.nbytes = 0
        self.evicted = 0  # checkpoints dropped for room, since the start

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, tokens: Sequence[int | str]) -> bool:
        return tuple(tokens) in self._entries

    @property
    def lengths(self) -> list[int]:
        """The stored prefixes' lengths, least recently used first."""
        return [len(k) for k in self._entries]

    @property
    def kv_blocks(self) -> int:
        """How many distinct KV buffers the checkpoints keep."""
        return len(self._blocks)

    def bind(self, owner: Any) -> None:
        """Checkpoints are only good for the model (and cache settings) they were taken with: forget them on a change."""
        if owner is not self.owner:
            self.clear()
            self.owner = owner

    def clear(self) -> None:
        self._entries.clear()
        self._blocks.clear()
        self.nbytes = 0

    def forget_cache(self) -> None:
        """The engine's model is being replaced or unloaded (Engine.hold_caches): free every checkpoint now."""
        self.clear()
        self.owner = None

    def longest_prefix(self, tokens: Sequence[int | str]) -> Checkpoint | None:
        """The longest stored checkpoint that is a proper prefix of `tokens` (one token at least is left to read).

        Every stored prefix of `tokens` counts as used now, the longest first (see the module docstring)."""
        key = tuple(tokens)
        found = [c for k, c in self._entries.items() if len(k) < len(key) and key[: len(k)] == k]
        found.sort(key=lambda c: c.length, reverse=True)
        for c in found:
            self._entries.move_to_end(c.tokens)
        return found[0] if found else None

    def add(self, tokens: Sequence[int | str], cache: list, rope_delta: int = 0) -> Checkpoint | None:
        """Checkpoint `cache`, which holds exactly `tokens` (a Key) with positions `rope_delta` behind the count;
        None if it alone is over the pool's size."""
        key = tuple(tokens)
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key]
        checkpoint = snapshot(cache, key, rope_delta)
        if checkpoint.kv.nbytes + checkpoint.state_bytes > self.max_bytes:
            return None
        self._entries[key] = checkpoint
        self._retain(checkpoint)
        for k, old in list(self._entries.items()):  # the shorter ones of this prefix now read the new buffers
            if len(k) < len(key) and key[: len(k)] == k and old.kv is not checkpoint.kv:
                moved = replace(old, kv=checkpoint.kv)
                if old.mirror is not None:
                    old.mirror.checkpoint_moved(old, checkpoint, moved)
                self._retain(moved)
                self._release(old)
                self._entries[k] = moved  # an existing key: its place in the LRU order stays
        while self.nbytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self._release(dropped)
            self.evicted += 1
        return checkpoint

    def _retain(self, checkpoint: Checkpoint) -> None:
        block, users = self._blocks.get(id(checkpoint.kv), (checkpoint.kv, 0))
        if not users:
            self.nbytes += block.nbytes
        self._blocks[id(block)] = (block, users + 1)
        self.nbytes += checkpoint.state_bytes

    def _release(self, checkpoint: Checkpoint) -> None:
        block, users = self._blocks[id(checkpoint.kv)]
        if users == 1:
            del self._blocks[id(block)]
            self.nbytes -= block.nbytes
        else:
            self._blocks[id(block)] = (block, users - 1)
        self.nbytes -= checkpoint.state_bytes
