"""One checkpoint as a safetensors file's arrays and string header, and back (the adapter onto engine/checkpoints.py).

A file holds one checkpoint of `length` tokens: its DeltaNet state arrays, its pictures' spans, the MTP head's
context, and the full-attention layers' keys and values of the tokens after its `parent` only: a conversation's
checkpoints form a chain on disk, as they share one KV buffer in memory (pool.py), and a checkpoint read back
concatenates the KV of its chain, from the first file on. Every array's CRC-32 is in the header, so a file
garbled on disk is found out when read, never reused.

Header (all strings, as safetensors metadata must be): "format", "fingerprint", "digest" (the key's, keys.py),
"length", "parent" / "parent_length" ("" / "0": the chain starts here), "model" (a name for `qwen-desk cache`),
"layout" (JSON: one {"kv": index, "cls", "quant"} or {"state": n, "cls", "slots"} per cache layer), "spans" (JSON),
"head" (JSON or ""), "crc" (JSON: array name -> CRC-32).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from macapp.core.engine.checkpoints import Checkpoint, KVBlock, KVBuffers, KVLayer, Layer, RecurrentState

if TYPE_CHECKING:
    import mlx.core as mx

    from macapp.core.engine.mtp_context import HeadCheckpoint

FORMAT = "qwen-desk-prompt-1"


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


def _parts(x: Any) -> list[mx.array]:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def encode(checkpoint: Checkpoint, digest: str, parent: EntryInfo | None, fingerprint: str, model: str) -> Encoded:
    """`checkpoint` as arrays and header, its KV from `parent`'s length on (worker thread: the slices are copied
    here, a copy of the new tokens' KV only, so the writer thread runs no MLX graph)."""
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache

    start = parent.length if parent is not None else 0
    arrays: dict[str, mx.array] = {}
    layout: list[dict[str, Any]] = []
    for n, layer in enumerate(checkpoint.layers):
        if isinstance(layer, KVLayer):
            buf = checkpoint.kv.layers[layer.index]
            if buf.cls not in (KVCache, QuantizedKVCache):
                raise BadEntry(f"cannot write a {buf.cls.__name__} layer")
            keys, values = _parts(buf.keys), _parts(buf.values)
            for j, a in enumerate(keys):
                arrays[f"kv.{n}.k.{j}"] = mx.contiguous(a[..., start : checkpoint.length, :])
            for j, a in enumerate(values):
                arrays[f"kv.{n}.v.{j}"] = mx.contiguous(a[..., start : checkpoint.length, :])
            layout.append({"kv": len(keys), "cls": buf.cls.__name__, "quant": list(buf.quantization) if buf.quantization else None})
        else:
            if layer.cls is not ArraysCache:
                raise BadEntry(f"cannot write a {layer.cls.__name__} layer")
            for j, state in enumerate(layer.arrays):
                if state is not None:
                    arrays[f"state.{n}.{j}"] = state
            layout.append({"state": len(layer.arrays), "cls": layer.cls.__name__, "slots": [a is not None for a in layer.arrays]})
    spans = []
    for i, span in enumerate(checkpoint.spans):
        arrays[f"span.{i}"] = span.positions
        spans.append({"start": span.start, "end": span.end, "delta": span.delta, "base": span.base})
    head = _encode_head(checkpoint.head, arrays)
    arrays = {name: mx.contiguous(a) for name, a in arrays.items()}  # views of longer buffers (the head's) as their own bytes
    mx.eval(list(arrays.values()))
    metadata = {
        "format": FORMAT,
        "fingerprint": fingerprint,
        "digest": digest,
        "length": str(checkpoint.length),
        "parent": parent.digest if parent is not None else "",
        "parent_length": str(start),
        "model": model,
        "layout": json.dumps(layout),
        "spans": json.dumps(spans),
        "head": json.dumps(head) if head is not None else "",
    }
    return Encoded(arrays, metadata)


def _encode_head(head: HeadCheckpoint | None, arrays: dict[str, mx.array]) -> dict[str, Any] | None:
    if head is None:
        return None
    for i, (k, v) in enumerate(zip(head.keys, head.values, strict=True)):
        if k is not None and v is not None:
            arrays[f"head.k.{i}"], arrays[f"head.v.{i}"] = k, v
    if head.carry is not None:
        arrays["head.carry"] = head.carry[1]
    return {"base": head.base, "layers": len(head.keys), "carry": head.carry[0] if head.carry is not None else None}


def crcs(arrays: dict[str, mx.array]) -> dict[str, int]:
    """Each array's CRC-32 over its bytes (evaluated, contiguous arrays: no MLX graph runs)."""
    return {name: zlib.crc32(memoryview(a)) for name, a in arrays.items()}  # type: ignore[arg-type]  # MLX arrays are buffers; its stubs omit it


def info_of(metadata: dict[str, Any], nbytes: int, fingerprint: str) -> EntryInfo:
    """The index's record of a file from its header; BadEntry when it is not one of this store's for `fingerprint`."""
    try:
        if metadata.get("format") != FORMAT or metadata.get("fingerprint") != fingerprint:
            raise BadEntry("another format or model")
        return EntryInfo(str(metadata["digest"]), int(metadata["length"]), str(metadata["parent"]), int(metadata["parent_length"]), nbytes)
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


def decode(chain: Sequence[Part], tokens: Sequence[int | str], expected: Sequence[type]) -> Checkpoint:
    """The checkpoint the last part of `chain` holds (its KV read from every part, the first first), for `tokens`;
    `expected`: the cache layer classes of a fresh cache of the model. BadEntry when the parts do not fit."""
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache

    from macapp.core.vision.runner import PictureSpan

    classes: dict[str, type] = {c.__name__: c for c in (KVCache, QuantizedKVCache, ArraysCache)}
    last = chain[-1]
    try:
        layout = json.loads(last.metadata["layout"])
        if len(layout) != len(expected):
            raise BadEntry("another number of layers")
        at = 0
        for part in chain:
            if int(part.metadata["parent_length"]) != at:
                raise BadEntry("a chain with a gap")
            at = int(part.metadata["length"])
        if at != len(tokens):
            raise BadEntry("another length than its key")
        layers: list[Layer] = []
        buffers: list[KVBuffers] = []
        kv_bytes = state_bytes = 0
        for n, (desc, want) in enumerate(zip(layout, expected, strict=True)):
            cls = classes[desc["cls"]]
            if "kv" in desc:
                if want not in (KVCache, QuantizedKVCache):
                    raise BadEntry("a KV layer where the model has another kind")
                keys = [_joined([p.arrays[f"kv.{n}.k.{j}"] for p in chain], len(tokens)) for j in range(desc["kv"])]
                values = [_joined([p.arrays[f"kv.{n}.v.{j}"] for p in chain], len(tokens)) for j in range(desc["kv"])]
                quant = tuple(desc["quant"]) if desc["quant"] else None
                layers.append(KVLayer(len(buffers)))
                buffers.append(KVBuffers(cls, tuple(keys) if quant else keys[0], tuple(values) if quant else values[0], quant))
                kv_bytes += sum(a.nbytes for a in keys + values)
            else:
                if want is not cls:
                    raise BadEntry("a DeltaNet layer where the model has another kind")
                arrays = tuple(last.arrays[f"state.{n}.{j}"] if filled else None for j, filled in enumerate(desc["slots"]))
                layers.append(RecurrentState(cls, arrays))
                state_bytes += sum(a.nbytes for a in arrays if a is not None)
        spans = tuple(
            PictureSpan(s["start"], s["end"], last.arrays[f"span.{i}"], s["delta"], s["base"]) for i, s in enumerate(json.loads(last.metadata["spans"]))
        )
        head = _decode_head(last)
    except BadEntry:
        raise
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise BadEntry(f"a header or arrays that do not fit: {exc!r}") from exc
    mx.eval([a for b in buffers for a in _parts(b.keys) + _parts(b.values)])
    if head is not None:
        state_bytes += head.nbytes
    return Checkpoint(tuple(tokens), tuple(layers), KVBlock(tuple(buffers), len(tokens), kv_bytes), state_bytes, spans, None, head)


def _joined(parts: list[mx.array], length: int) -> mx.array:
    import mlx.core as mx

    joined = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-2)
    if joined.shape[-2] != length:
        raise BadEntry("KV arrays of another length")
    return joined


def _decode_head(part: Part) -> HeadCheckpoint | None:
    from macapp.core.engine.mtp_context import HeadCheckpoint

    raw = part.metadata.get("head", "")
    if not raw:
        return None
    desc = json.loads(raw)
    keys = tuple(part.arrays.get(f"head.k.{i}") for i in range(desc["layers"]))
    values = tuple(part.arrays.get(f"head.v.{i}") for i in range(desc["layers"]))
    carry = (int(desc["carry"]), part.arrays["head.carry"]) if desc["carry"] is not None else None
    return HeadCheckpoint(int(desc["base"]), keys, values, carry)
