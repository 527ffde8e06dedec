"""Prompt checkpoints: cache snapshots at message boundaries, shared by every API request, bounded in bytes.

Agents resend the whole conversation with each request, and Qwen3.5's DeltaNet layers cannot be trimmed back
to a shorter prefix, so the runner snapshots the cache at the boundaries render.py names while it reads a
prompt; the next request restores the longest stored prefix of its own tokens into a fresh cache and reads
only the rest.

A checkpoint is a detached SavedPosition; what it holds (no copy at the time) is in engine/positions.py.

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
content digest (macapp.core.serving.pictures), so a prefix matches only with the same pictures in the same places.
A checkpoint after a picture also keeps the picture's span (its mRoPE positions, engine/prompt_cache.py), which
the reading of the rest goes on from.

On disk (macapp.core.prompt_disk): with a `disk` shelf, every checkpoint added is also written to disk (off the
decode path), and a prompt whose longest prefix in memory is shorter than one on disk is resumed from the disk's,
which then stays in memory too: a new session, or the server after a restart, reads only what is new.

Several Macs: a checkpoint of a mirrored cache keeps its mirror (engine/positions.py), which the pool tells
of a checkpoint moved onto a newer KV block. Dropping one (eviction, clear) is the mirror's to notice (it goes
when the checkpoint is no longer referenced).
"""

from __future__ import annotations

import collections
from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from macapp.core.engine.positions import KVBlock, Key, SavedPosition, restore, save
from macapp.core.engine.prompt_cache import PromptCache

if TYPE_CHECKING:
    from macapp.core.engine.model_folder import LoadedModel
    from macapp.core.prompt_disk.shelf import ModelShelf

MEMORY, DISK = "memory", "disk"  # where a resumed prompt's checkpoint came from

__all__ = ["CheckpointPool", "KVBlock", "Key", "SavedPosition", "restore", "save"]


class CheckpointPool:
    """Checkpoints keyed by their token prefix, least recently used first out. Use on the engine's worker only."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max(0, int(max_bytes))
        self.owner: object | None = None  # what the checkpoints belong to (the loaded model), told apart by identity; see bind()
        self._entries: collections.OrderedDict[Key, SavedPosition] = collections.OrderedDict()
        self._blocks: dict[int, tuple[KVBlock, int]] = {}  # id -> (block, checkpoints using it)
        self.nbytes = 0
        self.evicted = 0  # checkpoints dropped for room, since the start
        self.disk: ModelShelf | None = None  # the owner's place in the disk store (None: memory only)

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

    def bind(self, owner: object, disk: "ModelShelf | None" = None) -> None:
        """Checkpoints are only good for the model (and cache settings) they were taken with: forget them on a change
        (`disk`: the owner's place in the disk store)."""
        if owner is not self.owner:
            self.clear()
            self.owner = owner
            self.disk = disk

    def clear(self) -> None:
        self._entries.clear()
        self._blocks.clear()
        self.nbytes = 0

    def forget_cache(self) -> None:
        """The engine's model is being replaced or unloaded (Engine.hold_caches): free every checkpoint now."""
        self.clear()
        self.owner = None
        self.disk = None

    def longest_prefix(self, tokens: Sequence[int | str]) -> SavedPosition | None:
        """The longest stored checkpoint that is a proper prefix of `tokens` (one token at least is left to read).

        Every stored prefix of `tokens` counts as used now, the longest first (see the module docstring)."""
        key = tuple(tokens)
        found = [c for k, c in self._entries.items() if len(k) < len(key) and key[: len(k)] == k]
        found.sort(key=lambda c: c.length, reverse=True)
        for c in found:
            self._entries.move_to_end(c.tokens)
        return found[0] if found else None

    def resume(self, tokens: Sequence[int | str], model: "LoadedModel") -> tuple[PromptCache, str]:
        """A cache to read `tokens` into: restored from their longest stored prefix, in memory or on disk, and where
        it came from (MEMORY or DISK); or a new one for `model` (a LoadedModel) and ""."""
        checkpoint = self.longest_prefix(tokens)
        found = self.disk.lookup(tokens, checkpoint.length if checkpoint is not None else 0) if self.disk is not None else None
        if found is not None:
            self._keep(found)
            return PromptCache.restore(found), DISK
        if checkpoint is None:
            return PromptCache.new(model), ""
        return PromptCache.restore(checkpoint), MEMORY

    def add(self, prompt: PromptCache) -> SavedPosition | None:
        """Checkpoint `prompt` as it is (its tokens are the key, its pictures kept); None if it alone is over the
        pool's size."""
        key = tuple(prompt.tokens)
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key]
        return self.add_saved(prompt.save())

    def add_saved(self, checkpoint: SavedPosition) -> SavedPosition | None:
        """Keep `checkpoint` (a detached position: its tokens are the key), on disk too with a `disk` shelf; the one
        stored already for its tokens if there is one; None if it alone is over the pool's size."""
        key = checkpoint.tokens
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key]
        if self.disk is not None:
            self.disk.put(checkpoint)
        return self._keep(checkpoint)

    def _keep(self, checkpoint: SavedPosition) -> SavedPosition | None:
        key = checkpoint.tokens
        kv = _block(checkpoint)
        if kv.nbytes + checkpoint.state_bytes > self.max_bytes:
            return None
        self._entries[key] = checkpoint
        self._retain(checkpoint)
        for k, old in list(self._entries.items()):  # the shorter ones of this prefix now read the new buffers
            if len(k) < len(key) and key[: len(k)] == k and old.kv is not checkpoint.kv:
                moved = replace(old, kv=checkpoint.kv)
                if old.mirror is not None:
                    old.mirror.moved(old, checkpoint, moved)
                self._retain(moved)
                self._release(old)
                self._entries[k] = moved  # an existing key: its place in the LRU order stays
        while self.nbytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self._release(dropped)
            self.evicted += 1
        return checkpoint

    def _retain(self, checkpoint: SavedPosition) -> None:
        kv = _block(checkpoint)
        block, users = self._blocks.get(id(kv), (kv, 0))
        if not users:
            self.nbytes += block.nbytes
        self._blocks[id(block)] = (block, users + 1)
        self.nbytes += checkpoint.state_bytes

    def _release(self, checkpoint: SavedPosition) -> None:
        block, users = self._blocks[id(_block(checkpoint))]
        if users == 1:
            del self._blocks[id(block)]
            self.nbytes -= block.nbytes
        else:
            self._blocks[id(block)] = (block, users - 1)
        self.nbytes -= checkpoint.state_bytes


def _block(checkpoint: SavedPosition) -> KVBlock:
    if checkpoint.kv is None:
        raise ValueError("the pool keeps detached positions (positions.save), not marks")
    return checkpoint.kv
