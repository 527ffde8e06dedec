"""One checkpoint (a detached engine SavedPosition) as a safetensors file's arrays and string header, and back.

The position's own conversion (SavedPosition.to_arrays / from_arrays, engine/positions.py) gives its arrays and a
JSON-able header; a file keeps them, except that its full-attention KV arrays (`kv.*`) hold only the tokens after
its `parent`: a conversation's checkpoints form a chain on disk, as they share one KV buffer in memory (pool.py),
and a checkpoint read back concatenates the KV of its chain, from the first file on. The tokens are not written
(the file's name is their digest, keys.py). Every array's CRC-32 is in the header, so a file garbled on disk is
found out when read, never reused.

Header (all strings, as safetensors metadata must be): "format", "fingerprint", "digest", "length", "parent" /
"parent_length" ("" / "0": the chain starts here), "model" (a name for `qwen-desk cache`), "position" (the
position's own header, as JSON), "crc" (JSON: array name -> CRC-32).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Mapping, Sequence

from macapp.core.engine.positions import KVLayer, RecurrentState, SavedPosition

if TYPE_CHECKING:
    import mlx.core as mx

FORMAT = "qwen-desk-prompt-1"
KV_PREFIX = "kv."  # SavedPosition.to_arrays's names for the full-attention KV buffers


class BadEntry(Exception):
    """A file that cannot be this store's checkpoint (garbled, truncated, another layout): skipped and removed."""


@dataclass(frozen=True)
class EntryInfo:
    """What the store's index keeps of a file (read from its header alone)."""

    digest: str
    length: int
    parent: str  # "" for the first of a chain
    parent_length: int
    nbytes: int


@dataclass(frozen=True)
class Encoded:
    """A checkpoint ready to be written: its arrays (evaluated, contiguous) and header."""

    arrays: dict[str, mx.array]
    metadata: dict[str, str]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def encode(position: SavedPosition, digest: str, parent: EntryInfo | None, fingerprint: str, model: str) -> Encoded:
    """`position` as arrays and header, its KV from `parent`'s length on (worker thread: the arrays are made
    contiguous and evaluated here, a copy of the new tokens' KV and the states, so the writer thread runs no MLX
    graph). BadEntry for a position that cannot be converted (a batch's DeltaNet state, a mark)."""
    import mlx.core as mx

    start = parent.length if parent is not None else 0
    try:
        arrays, header = position.to_arrays()
    except ValueError as exc:
        raise BadEntry(str(exc)) from exc
    header["tokens"] = []  # the key is the digest; the tokens come back from the prompt that finds the file
    arrays = {name: mx.contiguous(a[..., start:, :] if name.startswith(KV_PREFIX) else a) for name, a in arrays.items()}
    mx.eval(list(arrays.values()))
    metadata = {
        "format": FORMAT,
        "fingerprint": fingerprint,
        "digest": digest,
        "length": str(position.length),
        "parent": parent.digest if parent is not None else "",
        "parent_length": str(start),
        "model": model,
        "position": json.dumps(header),
    }
    return Encoded(arrays, metadata)


def crcs(arrays: dict[str, mx.array]) -> dict[str, int]:
    """Each array's CRC-32 over its bytes (evaluated, contiguous arrays: no MLX graph runs)."""
    return {name: zlib.crc32(memoryview(a)) for name, a in arrays.items()}  # type: ignore[arg-type]  # MLX arrays are buffers; its stubs omit it


def info_of(metadata: Mapping[str, object], nbytes: int, fingerprint: str) -> EntryInfo:
    """The index's record of a file from its header; BadEntry when it is not one of this store's for `fingerprint`."""
    try:
        if metadata.get("format") != FORMAT or metadata.get("fingerprint") != fingerprint:
            raise BadEntry("another format or model")
        return EntryInfo(str(metadata["digest"]), int(str(metadata["length"])), str(metadata["parent"]), int(str(metadata["parent_length"])), nbytes)
    except (KeyError, ValueError, TypeError) as exc:
        raise BadEntry(f"a header without {exc}") from exc


@dataclass(frozen=True)
class Part:
    """One file of a chain as read: its header and arrays (checked against their CRCs)."""

    metadata: dict[str, str]
    arrays: dict[str, mx.array]


def read_part(path: str) -> Part:
    """A file's header and arrays; BadEntry for a file that cannot be read whole or whose bytes changed."""
    import mlx.core as mx

    try:
        loaded = mx.load(path, return_metadata=True)
        arrays, metadata = loaded if isinstance(loaded, tuple) else (loaded, {})
        assert isinstance(arrays, dict)
        expected = json.loads(metadata["crc"])
        if not isinstance(expected, dict) or set(expected) != set(arrays) or crcs(arrays) != expected:
            raise BadEntry("its arrays do not match their checksums")
    except BadEntry:
        raise
    except FileNotFoundError:
        raise
    except Exception as exc:  # mlx's own errors for a truncated or garbled file, a header that is not JSON
        raise BadEntry(str(exc) or type(exc).__name__) from exc
    return Part(dict(metadata), arrays)


def decode(chain: Sequence[Part], tokens: Sequence[int | str], expected: Sequence[type]) -> SavedPosition:
    """The position the last part of `chain` holds (its KV read from every part, the first first), for `tokens`;
    `expected`: the cache layer classes of a fresh cache of the model. BadEntry when the parts do not fit."""
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache

    last = chain[-1]
    try:
        at = 0
        for part in chain:
            if int(part.metadata["parent_length"]) != at:
                raise BadEntry("a chain with a gap")
            at = int(part.metadata["length"])
        if at != len(tokens):
            raise BadEntry("another length than its key")
        arrays = dict(last.arrays)
        for name in [n for n in arrays if n.startswith(KV_PREFIX)]:
            pieces = [part.arrays[name] for part in chain]
            arrays[name] = pieces[0] if len(pieces) == 1 else mx.concatenate(pieces, axis=-2)
            if arrays[name].shape[-2] != len(tokens):
                raise BadEntry("KV arrays of another length")
        header = json.loads(last.metadata["position"])
        position = replace(SavedPosition.from_arrays(arrays, header), tokens=tuple(tokens))
    except BadEntry:
        raise
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise BadEntry(f"a header or arrays that do not fit: {exc!r}") from exc
    own = position.cache_layers
    if position.length != len(tokens) or len(own) != len(expected):
        raise BadEntry("another number of layers or tokens")
    for layer, want in zip(own, expected):
        kv = isinstance(layer, KVLayer) and layer.length == len(tokens) and want in (KVCache, QuantizedKVCache)
        if not kv and not (isinstance(layer, RecurrentState) and want is ArraysCache):
            raise BadEntry("layers of another kind than the model's")
    mx.eval(list(arrays.values()))
    return position
