"""Rank 0 drives, the other ranks follow: every model call and cache operation, in the same order everywhere.

A sharded model only works if every rank runs the same forward passes with the same inputs, because the
layers exchange partial results (tensor parallelism) or hidden states (pipeline) inside each call. Rank 0 runs
the app's engine unchanged on a `LockstepModel`, the runtime's model proxy (engine/model_proxy.py): before each forward call, and before each cache operation
(new cache, snapshot, restore, free), it broadcasts a small command to the followers, which run the same
thing on their own shards and caches (`Follower.run`). The broadcast is an `all_sum` over MLX distributed in
which only rank 0 contributes: an int32 header carrying up to 8 tokens (a decode step is one collective), then
longer token lists. No transport of our own.

Two details keep the ranks in step:
- Each forward call evaluates the same arrays on every rank, inside the call: the cache states and the
  logits of the last position only (mlx-lm's callers use only those; the head is computed for one position,
  which also saves a prefill chunk's worth of logits). What is evaluated decides which collectives run.
- A KV layer rank 0's caller has quantized (mlx-lm's maybe_quantize_kv_cache, after a call) is quantized on
  the followers before their next operation on that cache: the header carries the bits and group size.

Saved positions (engine/positions.py: regenerate/edit marks and the API's prompt checkpoints alike) are mirrored
the same way, through the caches' mirror hook (positions.CacheMirror), never by knowing who keeps them: the
LockstepModel hears of each position taken (a mark, or a detached one), rewound to, moved onto a newer KV block,
or restored into a fresh cache, and every follower does the same with its own shards' arrays, keeping its
positions by the ids rank 0 gives them (the token keys, the LRU order and the byte bound stay with whoever keeps
them on rank 0).

Frees come from garbage collection on rank 0 (a dropped cache or saved position), queued, and sent
before the next command. A lost peer makes the collective raise (`RankLost`) on every rank still alive.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import itertools
import weakref
from typing import TYPE_CHECKING, Any

from macapp.core import events as ev
from macapp.core.cache_layers import CacheLayers
from macapp.core.cluster.watchdog import Wait, Watchdog
from macapp.core.engine.errors import EngineError
from macapp.core.engine.model_proxy import ModelProxy
from macapp.core.engine import positions
from macapp.core.engine.positions import ObservedCache, SavedPosition

if TYPE_CHECKING:  # naming MLX's types costs nothing at start-up
    import mlx.core as mx
    import mlx.nn as nn

HEADER = 8  # op, up to 6 fields, payload length
INLINE = 8  # payloads this short travel in the header's all_sum (a decode step is one token)


class Op(enum.IntEnum):
    NEW_CACHE = 1
    FORWARD = 2
    SNAPSHOT = 3
    RESTORE = 4
    FREE = 5
    SHUTDOWN = 6
    CHECKPOINT = 7  # cache id, checkpoint id, length, KV quantization
    CHECKPOINT_MOVE = 8  # checkpoint id, the one whose KV block it now reads, the moved checkpoint's id
    CHECKPOINT_RESTORE = 9  # new cache id, checkpoint id


class RankLost(EngineError):
    """A collective failed: another rank died, was killed, or cannot be reached any more."""

    def __init__(self, detail: str):
        super().__init__(f"Lost contact with another Mac of the cluster ({detail}); every rank is being stopped.", ev.ERROR)
        self.detail = detail


class Channel:
    """Rank 0 to every rank, over the group: `send` on rank 0, `receive` elsewhere (both block until all join)."""

    def __init__(self, group: mx.distributed.Group):
        self.group = group
        self.rank = group.rank()

    def _all_sum(self, values: mx.array) -> mx.array:
        import mlx.core as mx

        try:
            out = mx.distributed.all_sum(values, group=self.group, stream=mx.cpu)
            mx.eval(out)
        except RuntimeError as exc:
            raise RankLost(str(exc)) from exc
        return out

    def send(self, op: Op, *fields: int, payload: list[int] | None = None) -> None:
        import mlx.core as mx

        payload = payload or []
        inline = payload if len(payload) <= INLINE else []
        header = [int(op), *fields] + [0] * (HEADER - 2 - len(fields)) + [len(payload)]  # length last
        self._all_sum(mx.array(header + inline + [0] * (INLINE - len(inline)), dtype=mx.int32))
        if len(payload) > INLINE:
            self._all_sum(mx.array(payload, dtype=mx.int32))

    def receive(self) -> tuple[Op, list[int], list[int]]:
        import mlx.core as mx

        message = ints(self._all_sum(mx.zeros((HEADER + INLINE,), dtype=mx.int32)))
        header, n = message[:HEADER], message[HEADER - 1]
        if n <= INLINE:
            payload = message[HEADER : HEADER + n]
        else:
            payload = ints(self._all_sum(mx.zeros((n,), dtype=mx.int32)))
        return Op(header[0]), header[1:-1], payload


def ints(values: mx.array) -> list[int]:
    """A 1-D int32 array's values (TypeError for anything else)."""
    out = values.tolist()
    found = [v for v in out if isinstance(v, int)] if isinstance(out, list) else []
    if not isinstance(out, list) or len(found) != len(out):
        raise TypeError(f"expected a 1-D array of integers, got {type(out).__name__}")
    return found


# --- what every rank runs the same way ---


def _head(lm: nn.Module, hidden: mx.array) -> mx.array:
    """The output head of mlx-lm's Qwen3.5 TextModel (tied embedding, or lm_head gathered across a tensor group)."""
    if lm.args.tie_word_embeddings:
        tied: mx.array = lm.model.embed_tokens.as_linear(hidden)
        return tied
    from mlx_lm.models.base import gather_last_axis

    out = lm.lm_head(hidden)
    return gather_last_axis(out, lm.sharding_group) if lm.sharding_group is not None else out


def forward(model: nn.Module, tokens: mx.array, cache: CacheLayers) -> mx.array:
    """One forward call, evaluated here on every rank alike: the cache states and the last position's logits."""
    import mlx.core as mx

    lm = model.language_model
    hidden = lm.model(tokens, cache)
    logits = _head(lm, hidden[:, -1:, :])
    try:
        mx.eval(logits, [c.state for c in cache])
    except RuntimeError as exc:  # a collective inside the model: a peer went away
        raise RankLost(str(exc)) from exc
    return logits


def quantization_of(cache: CacheLayers) -> tuple[int, int]:
    """(bits, group size) of the cache's quantized KV layers, (0, 0) while none is."""
    from mlx_lm.models.cache import QuantizedKVCache

    for layer in cache:
        if isinstance(layer, QuantizedKVCache):
            return int(layer.bits), int(layer.group_size)
    return 0, 0


def match_quantization(cache: CacheLayers, bits: int, group: int) -> None:
    """Quantize the KV layers rank 0 has quantized since the last operation on this cache."""
    if not bits:
        return
    for i, layer in enumerate(cache):
        if hasattr(layer, "to_quantized"):
            cache[i] = layer.to_quantized(group_size=group, bits=bits)


# --- rank 0 ---


class MirroredCache(ObservedCache):
    """Rank 0's prompt cache (mlx-lm's list of layer caches); each follower holds its own under the same id.
    Its mirror (the LockstepModel) hears of its saved positions and tells the followers."""

    def __init__(self, layers: CacheLayers, cache_id: int, owner: "LockstepModel"):
        super().__init__(layers)
        self.cache_id = cache_id
        self.mirror = owner


class LockstepModel(ModelProxy):
    """The loaded model as rank 0's engine sees it: the same calls, each one broadcast to the followers first.

    Use it from one thread (the engine's worker). Anything not overridden is the model's own attribute."""

    runs_pictures = False  # the ranks run only token forward passes in lock step
    pictures_refusal = "Pictures are not supported on several Macs yet: send them in a chat on one Mac."

    def __init__(self, model: nn.Module, group: mx.distributed.Group, watchdog: Watchdog | None = None):
        """`watchdog`: the bound on every wait for the followers (default: adaptive limits)."""
        self._model = model
        self._channel = Channel(group)
        self._watchdog = watchdog or Watchdog()
        self._ids = itertools.count(1)
        self._freed: collections.deque[tuple[int, int]] = collections.deque()  # (kind, id), appended by GC
        self._positions: dict[int, int] = {}  # id(SavedPosition) -> the id the followers know it by
        self.closed = False

    def __getattr__(self, name: str) -> Any:  # whatever mlx-lm's model object has
        return getattr(self._model, name)

    @property
    def inner(self) -> nn.Module:
        return self._model

    def _send(self, op: Op, *fields: int, payload: list[int] | None = None) -> None:
        if self.closed:
            raise RankLost("the other ranks have been shut down")
        freed: list[int] = []
        while self._freed:
            freed.extend(self._freed.popleft())
        with self._watchdog.waiting(Wait.HEADER):
            if freed:
                self._channel.send(Op.FREE, payload=freed)
            self._channel.send(op, *fields, payload=payload)

    def make_cache(self) -> MirroredCache:
        cache_id = next(self._ids)
        self._send(Op.NEW_CACHE, cache_id)
        return self._mirrored(self._model.make_cache(), cache_id)

    def _mirrored(self, layers: CacheLayers, cache_id: int) -> MirroredCache:
        cache = MirroredCache(layers, cache_id, self)
        weakref.finalize(cache, self._freed.append, (Op.NEW_CACHE.value, cache_id))
        return cache

    def __call__(self, inputs: mx.array, cache: CacheLayers | None = None, input_embeddings: mx.array | None = None) -> mx.array:
        if not isinstance(cache, MirroredCache):
            raise TypeError("a model shared across several Macs runs only with its own caches (make_cache)")
        if input_embeddings is not None:
            raise ValueError("images are not supported on several Macs yet")
        if inputs.ndim != 2 or inputs.shape[0] != 1:
            raise ValueError("a model shared across several Macs runs one sequence at a time")
        tokens = ints(inputs.reshape(-1))
        self._send(Op.FORWARD, cache.cache_id, *quantization_of(cache), payload=tokens)
        with self._watchdog.waiting(Wait.CALL):
            return forward(self._model, inputs, cache)

    # -- saved positions, as a MirroredCache's mirror (positions.CacheMirror) --------------------------------------
    def saved(self, observed: ObservedCache, position: SavedPosition) -> None:
        cache = _own(observed)
        ident = self._position_id(position)
        op = Op.SNAPSHOT if position.kv is None else Op.CHECKPOINT
        self._send(op, cache.cache_id, ident, position.length, *quantization_of(cache))

    def rewound(self, observed: ObservedCache, position: SavedPosition) -> None:
        cache = _own(observed)
        self._send(Op.RESTORE, cache.cache_id, self._positions[id(position)], *quantization_of(cache))

    def moved(self, old: SavedPosition, onto: SavedPosition, moved: SavedPosition) -> None:
        ident = self._position_id(moved)
        self._send(Op.CHECKPOINT_MOVE, self._positions[id(old)], self._positions[id(onto)], ident)

    def restored(self, position: SavedPosition, layers: CacheLayers) -> MirroredCache:
        cache_id = next(self._ids)
        self._send(Op.CHECKPOINT_RESTORE, cache_id, self._positions[id(position)])
        return self._mirrored(layers, cache_id)

    def _position_id(self, position: SavedPosition) -> int:
        ident = next(self._ids)
        self._positions[id(position)] = ident
        weakref.finalize(position, self._position_gone, id(position), ident)
        return ident

    def _position_gone(self, key: int, ident: int) -> None:
        if self._positions.get(key) == ident:
            del self._positions[key]
        self._freed.append((Op.CHECKPOINT.value, ident))

    def shutdown(self) -> None:
        """Tell the followers to end (they exit 0); later calls raise RankLost."""
        if not self.closed:
            try:
                self._channel.send(Op.SHUTDOWN)
            finally:
                self.closed = True

    def close(self) -> None:
        """The engine is closing: shut the followers down (nobody to tell when they are gone already)."""
        try:
            self.shutdown()
        except RankLost:
            pass


def _own(cache: ObservedCache) -> MirroredCache:
    """The caches a LockstepModel mirrors are the ones it made (make_cache, checkpoint_restored)."""
    if not isinstance(cache, MirroredCache):
        raise TypeError("a model shared across several Macs mirrors only its own caches (make_cache)")
    return cache


# --- the other ranks ---


class Follower:
    """A rank other than 0: runs rank 0's commands on its own shard until told to stop."""

    def __init__(self, model: nn.Module, group: mx.distributed.Group):
        self.model = model
        self.channel = Channel(group)
        self.caches: dict[int, CacheLayers] = {}
        self.positions: dict[int, SavedPosition] = {}  # position id -> this rank's saved position

    def run(self) -> None:
        """Follow until SHUTDOWN; RankLost when rank 0 goes away."""
        while self.step():
            pass

    def step(self) -> bool:
        op, f, payload = self.channel.receive()
        match op:
            case Op.NEW_CACHE:
                self.caches[f[0]] = self.model.make_cache()
            case Op.FORWARD:
                import mlx.core as mx

                cache = self.caches[f[0]]
                match_quantization(cache, f[1], f[2])
                forward(self.model, mx.array(payload, dtype=mx.int32)[None], cache)
            case Op.SNAPSHOT:
                cache = self.caches[f[0]]
                match_quantization(cache, f[3], f[4])
                self.positions[f[1]] = positions.mark(cache, f[2])
            case Op.RESTORE:
                cache = self.caches[f[0]]
                match_quantization(cache, f[2], f[3])
                positions.rewind(cache, self.positions[f[1]])
            case Op.CHECKPOINT:
                cache = self.caches[f[0]]
                match_quantization(cache, f[3], f[4])
                self.positions[f[1]] = positions.save(cache, (0,) * f[2])  # the token keys are rank 0's
            case Op.CHECKPOINT_MOVE:
                old, onto = self.positions[f[0]], self.positions[f[1]]
                self.positions[f[2]] = dataclasses.replace(old, kv=onto.kv)
            case Op.CHECKPOINT_RESTORE:
                self.caches[f[0]] = positions.restore(self.positions[f[1]])
            case Op.FREE:
                for kind, ident in zip(payload[::2], payload[1::2]):
                    if kind == Op.NEW_CACHE:
                        self.caches.pop(ident, None)
                    else:
                        self.positions.pop(ident, None)
            case Op.SHUTDOWN:
                return False
        return True
