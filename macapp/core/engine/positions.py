"""Saved positions: a point in a sequence's cache to come back to. The one type behind regenerate/edit/undo, the
API's prompt checkpoints, the several-Macs mirror and the disk.

A `SavedPosition` holds, for each layer of the cache in order (mlx-lm's list of layer caches), then for each
layer of the MTP head's own cache appended after them (the way mlx-engine's CacheWrapper appends its draft
model's layers):
- a full-attention layer (mlx-lm KVCache / QuantizedKVCache): `KVLayer`, its length. They only grow, so going
  back is a trim (it works on a layer quantized in between, too).
- a Gated DeltaNet layer (ArraysCache): `RecurrentState`, references to its state arrays. The model replaces
  them on every step instead of writing into them, so keeping the references costs no copy.
- an MTP head layer: `HeadLayer`, views of its keys and values from the position `HeadPlace.base` on
  (mtp_context.py says what the head's context is); `head` keeps where it starts and its carried hidden state.
plus the pictures among the tokens (`spans`, vision.spans.PictureSpan: where they put the mRoPE positions).

Two ways to take one, and two ways back:

    position = mark(cache, length)                 # lengths and DeltaNet references only: no copy, nothing kept
    rewind(cache, position)                        # the same cache back there (regenerate, edit, undo, MTP rounds)

    position = save(cache, tokens, spans, head)    # "detached": also views of the KV buffers (`kv`)
    layers = restore(position)                     # a fresh cache there; reading on never writes into `position`
    arrays, header = position.to_arrays()          # plain arrays + a small JSON-able header (no pickles)
    position = SavedPosition.from_arrays(arrays, header)

A detached position's KV views cost nothing at the time: the live cache goes on writing into its buffer in place,
but MLX never writes into a buffer another array still shares, so its next write copies the buffer and the view
keeps the old contents (one buffer copy, deferred). The KV buffers sit in a `KVBlock` that the positions of one
token prefix share (the API's pool moves the shorter ones onto the newest block: serving/pool.py); each reads
its first `length` positions.

Several Macs: a cache that is mirrored on other ranks (an ObservedCache with a `mirror`, cluster/lockstep.py)
tells its mirror of every position saved from it or rewound into it, and a detached position keeps the mirror,
which hears of it being moved onto a newer KV block or restored into a fresh cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, Sequence, TypedDict, cast

from macapp.core.cache_layers import CacheLayers
from macapp.core.vision.spans import PictureSpan

if TYPE_CHECKING:
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache

    KVArrays = mx.array | tuple[mx.array, ...]  # a KV layer's keys or values (QuantizedKVCache: data, scales, biases)

Key = tuple[int | str, ...]  # token ids; a picture's image tokens are its digest (macapp.core.serving.pictures)


class LayerEntry(TypedDict, total=False):
    kind: str  # "kv", "state" (DeltaNet) or "head" (an MTP head layer)
    length: int  # kv: its length
    index: int | None  # kv: its buffers in Header.kv
    slots: list[bool]  # state: which state arrays are filled
    held: bool  # head: whether it holds entries


class KVEntry(TypedDict):
    cls: str  # "KVCache" or "QuantizedKVCache" (mlx_lm.models.cache)
    quantization: list[int] | None  # [group_size, bits]
    parts: int | None  # a quantized buffer's arrays (data, scales, biases); None: one array


class HeadEntry(TypedDict):
    base: int
    carry: int | None  # the carried hidden state's position (array "head.carry")


class SpanEntry(TypedDict):
    start: int
    end: int
    delta: int
    base: int  # its positions are the array "span.<i>.positions"


class Header(TypedDict):
    """The JSON-able header of SavedPosition.to_arrays."""

    format: str
    version: int
    length: int
    tokens: list[int | str]
    layers: list[LayerEntry]
    kv: list[KVEntry]
    head: HeadEntry | None
    spans: list[SpanEntry]


FORMAT = "qwen-desk.saved-position"
VERSION = 1
_CACHE_CLASSES = ("KVCache", "QuantizedKVCache", "ArraysCache")  # mlx_lm.models.cache classes a header may name


class CacheMirror(Protocol):
    """What repeats a cache's saved positions elsewhere: several Macs keep every rank's cache in step with rank 0's
    (macapp.core.cluster.lockstep)."""

    def saved(self, cache: "ObservedCache", position: "SavedPosition") -> None:
        """`position` was taken from `cache` (by mark or save)."""

    def rewound(self, cache: "ObservedCache", position: "SavedPosition") -> None:
        """`cache` went back to `position`."""

    def moved(self, old: "SavedPosition", onto: "SavedPosition", moved: "SavedPosition") -> None:
        """`moved` is `old` reading the KV block of `onto` (the API's pool)."""

    def restored(self, position: "SavedPosition", layers: CacheLayers) -> CacheLayers:
        """`layers` is a fresh cache at `position`: returns the cache to use (one it mirrors)."""


class ObservedCache(CacheLayers):
    """A prompt cache (mlx-lm's list of layers) with a `mirror` told of its saved positions."""

    mirror: CacheMirror | None = None


@dataclass(frozen=True)
class KVLayer:
    """A full-attention layer: its length, and where its buffers are in the position's KVBlock (None: a mark)."""

    length: int
    index: int | None = None


@dataclass(frozen=True)
class RecurrentState:
    """A DeltaNet layer (ArraysCache): its state arrays then (never written in place), as mlx-lm keeps them."""

    arrays: tuple[mx.array | None, ...]  # None: a slot the model has not filled yet
    left_padding: mx.array | None = None  # a batch's (marks of the batch's own caches only)
    lengths: mx.array | None = None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays if a is not None)


@dataclass(frozen=True)
class HeadLayer:
    """An MTP head layer: views of its keys and values, entries from `HeadPlace.base` on (None: it holds nothing)."""

    keys: mx.array | None
    values: mx.array | None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.keys, self.values) if a is not None)


@dataclass(frozen=True)
class HeadPlace:
    """Where the MTP head's entries start, and the carried hidden state (position, (1, 1, H)) of the last token."""

    base: int
    carry: tuple[int, mx.array] | None


Layer = KVLayer | RecurrentState | HeadLayer
HeadPart = tuple[HeadPlace, tuple[HeadLayer, ...]]  # the MTP head's context at a position (HeadContext.saved)


@dataclass(frozen=True)
class KVBuffers:
    """A full-attention layer's key/value buffers (a tuple of arrays each when quantized)."""

    cls: type  # KVCache or QuantizedKVCache
    keys: KVArrays
    values: KVArrays
    quantization: tuple[int, int] | None  # (group_size, bits) of a QuantizedKVCache


@dataclass(eq=False)
class KVBlock:
    """The KV buffers of every full-attention layer, holding `length` tokens; shared by the positions of one
    token prefix (each reads the first `SavedPosition.length` positions)."""

    layers: tuple[KVBuffers, ...]
    length: int
    nbytes: int


@dataclass(frozen=True)
class SavedPosition:
    """A point in a sequence's cache (see the module docstring): `length` tokens, each layer as it was then."""

    length: int
    layers: tuple[Layer, ...]  # the cache's layers in order, then the MTP head's (when `head` is set)
    tokens: Key = ()  # the tokens held (a detached position's key; a mark may leave them out)
    kv: KVBlock | None = field(default=None, compare=False, repr=False)  # the KV buffers (None: a mark)
    spans: tuple[PictureSpan, ...] = field(default=(), compare=False)  # the pictures among `tokens`
    head: HeadPlace | None = field(default=None, compare=False, repr=False)
    mirror: CacheMirror | None = field(default=None, compare=False, repr=False)

    @property
    def detached(self) -> bool:
        """Whether it holds its KV buffers: restorable into a fresh cache and convertible to arrays."""
        return self.kv is not None

    @property
    def cache_layers(self) -> tuple[KVLayer | RecurrentState, ...]:
        """The model cache's layers (the MTP head's left out)."""
        return tuple(layer for layer in self.layers if not isinstance(layer, HeadLayer))

    @property
    def head_part(self) -> HeadPart | None:
        """The MTP head's context kept here (mtp_context.HeadContext.restore), or None."""
        if self.head is None:
            return None
        return self.head, tuple(layer for layer in self.layers if isinstance(layer, HeadLayer))

    @property
    def state_bytes(self) -> int:
        """Memory this position alone keeps alive: the DeltaNet states and the MTP head's entries of its point."""
        return sum(layer.nbytes for layer in self.layers if not isinstance(layer, KVLayer))

    @property
    def rope_delta(self) -> int:
        """The next token's position minus `length`: what the pictures before it moved (< 0 after one, else 0)."""
        return sum(span.delta for span in self.spans)

    def as_mark(self) -> "SavedPosition":
        """The same point without its KV buffers (lengths only) nor the MTP head's layers: enough to rewind a cache
        holding these tokens, keeping nothing but the DeltaNet states alive."""
        layers = tuple(KVLayer(layer.length) if isinstance(layer, KVLayer) else layer for layer in self.cache_layers)
        return replace(self, layers=layers, kv=None, head=None, mirror=None)

    # -- plain arrays --------------------------------------------------------------------------------------
    def to_arrays(self) -> tuple[dict[str, mx.array], Header]:
        """`(arrays, header)`: a detached position as plain arrays (what mx.save_safetensors writes) and a small
        JSON-able header; `SavedPosition.from_arrays(arrays, header)` gives it back. Only the position's own
        `length` KV entries are written (not the rest of a shared block). Arrays are named:
        `kv.<i>.keys[.<part>]` / `kv.<i>.values[.<part>]` (KV buffers; parts of a quantized one), `layer.<n>.<slot>`
        (a DeltaNet layer's state), `layer.<n>.keys` / `layer.<n>.values` (an MTP head layer), `head.carry`,
        `span.<i>.positions`. ValueError for a mark."""
        kv = self.kv
        if kv is None:
            raise ValueError("a mark holds no KV buffers: save() a detached position to convert it")
        arrays: dict[str, mx.array] = {}
        layers: list[LayerEntry] = []
        for n, layer in enumerate(self.layers):
            if isinstance(layer, KVLayer):
                layers.append({"kind": "kv", "length": layer.length, "index": layer.index})
            elif isinstance(layer, RecurrentState):
                if layer.left_padding is not None or layer.lengths is not None:
                    raise ValueError("a batched DeltaNet state cannot be converted")
                layers.append({"kind": "state", "slots": [a is not None for a in layer.arrays]})
                arrays.update({f"layer.{n}.{j}": a for j, a in enumerate(layer.arrays) if a is not None})
            else:
                layers.append({"kind": "head", "held": layer.keys is not None and layer.values is not None})
                if layer.keys is not None and layer.values is not None:
                    arrays[f"layer.{n}.keys"], arrays[f"layer.{n}.values"] = layer.keys, layer.values
        buffers: list[KVEntry] = []
        for i, buf in enumerate(kv.layers):
            for name, x in (("keys", buf.keys), ("values", buf.values)):
                parts = _views(x, self.length)
                if isinstance(parts, tuple):
                    arrays.update({f"kv.{i}.{name}.{j}": a for j, a in enumerate(parts)})
                else:
                    arrays[f"kv.{i}.{name}"] = parts
            buffers.append(
                {
                    "cls": buf.cls.__name__,
                    "quantization": list(buf.quantization) if buf.quantization is not None else None,
                    "parts": len(buf.keys) if isinstance(buf.keys, (tuple, list)) else None,
                }
            )
        head: HeadEntry | None = None
        if self.head is not None:
            head = {"base": self.head.base, "carry": self.head.carry[0] if self.head.carry is not None else None}
            if self.head.carry is not None:
                arrays["head.carry"] = self.head.carry[1]
        spans: list[SpanEntry] = []
        for i, span in enumerate(self.spans):
            spans.append({"start": span.start, "end": span.end, "delta": span.delta, "base": span.base})
            arrays[f"span.{i}.positions"] = span.positions
        header: Header = {
            "format": FORMAT,
            "version": VERSION,
            "length": self.length,
            "tokens": list(self.tokens),
            "layers": layers,
            "kv": buffers,
            "head": head,
            "spans": spans,
        }
        return arrays, header

    @classmethod
    def from_arrays(cls, arrays: dict[str, mx.array], header: Header) -> "SavedPosition":
        """The detached position `to_arrays` gave `(arrays, header)` for (the arrays as mx.load reads them back).
        ValueError, saying what is wrong, for a header of another format or version, or arrays missing."""
        from mlx_lm.models import cache as mlx_cache

        if header.get("format") != FORMAT or header.get("version") != VERSION:
            raise ValueError(f"not a saved position of version {VERSION} (format {header.get('format')!r}, version {header.get('version')!r})")

        def array(name: str) -> mx.array:
            if name not in arrays:
                raise ValueError(f"the saved position's array {name!r} is missing")
            return arrays[name]

        def cache_class(name: object) -> type:
            if name not in _CACHE_CLASSES:
                raise ValueError(f"a saved position names an unknown cache layer class {name!r}")
            return cast(type, getattr(mlx_cache, str(name)))

        length = int(header["length"])
        buffers: list[KVBuffers] = []
        nbytes = 0
        for i, buf in enumerate(header["kv"]):
            parts = buf["parts"]
            got: list[KVArrays] = []
            for name in ("keys", "values"):
                x: KVArrays = tuple(array(f"kv.{i}.{name}.{j}") for j in range(parts)) if parts else array(f"kv.{i}.{name}")
                nbytes += sum(a.nbytes for a in _arrays(x))
                got.append(x)
            quant = buf["quantization"]
            buffers.append(KVBuffers(cache_class(buf["cls"]), got[0], got[1], (int(quant[0]), int(quant[1])) if quant else None))
        layers: list[Layer] = []
        for n, layer in enumerate(header["layers"]):
            match layer["kind"]:
                case "kv":
                    layers.append(KVLayer(int(layer["length"]), layer["index"]))
                case "state":
                    layers.append(RecurrentState(tuple(array(f"layer.{n}.{j}") if filled else None for j, filled in enumerate(layer["slots"]))))
                case "head":
                    held = bool(layer["held"])
                    layers.append(HeadLayer(array(f"layer.{n}.keys") if held else None, array(f"layer.{n}.values") if held else None))
                case other:
                    raise ValueError(f"a saved position names an unknown layer kind {other!r}")
        head = None
        if header["head"] is not None:
            at = header["head"]["carry"]
            head = HeadPlace(int(header["head"]["base"]), (int(at), array("head.carry")) if at is not None else None)
        spans: tuple[PictureSpan, ...] = ()
        if header["spans"]:
            spans = tuple(
                PictureSpan(int(s["start"]), int(s["end"]), array(f"span.{i}.positions"), int(s["delta"]), int(s["base"]))
                for i, s in enumerate(header["spans"])
            )
        tokens: Key = tuple(header["tokens"])
        return cls(length, tuple(layers), tokens, KVBlock(tuple(buffers), length, nbytes), spans, head)


def _views(x: KVArrays, offset: int) -> KVArrays:
    if isinstance(x, (tuple, list)):
        return tuple(a[..., :offset, :] for a in x)
    return x[..., :offset, :]


def _arrays(x: KVArrays) -> list[mx.array]:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _recurrent(layer: ArraysCache) -> RecurrentState:
    """An ArraysCache's state, read from its attributes (mlx-lm's `state` changed shape between releases)."""
    return RecurrentState(tuple(layer.cache), layer.left_padding, layer.lengths)


def _set_cache(layer: ArraysCache, arrays: tuple[mx.array | None, ...]) -> None:
    setattr(layer, "cache", list(arrays))  # mlx-lm types the slots as the Nones they start as


def _told(cache: CacheLayers, position: SavedPosition) -> SavedPosition:
    if isinstance(cache, ObservedCache) and cache.mirror is not None:
        cache.mirror.saved(cache, position)
    return position


def mark(cache: CacheLayers, length: int) -> SavedPosition:
    """Where `cache` (holding `length` tokens) is now, to `rewind` it to: no copy, and nothing kept but the DeltaNet
    states of this point. TypeError for a layer that cannot come back."""
    from mlx_lm.models.cache import ArraysCache

    layers: list[Layer] = []
    for layer in cache:
        if isinstance(layer, ArraysCache):
            layers.append(_recurrent(layer))
        elif layer.is_trimmable():
            layers.append(KVLayer(int(layer.offset)))
        else:  # pragma: no cover - a cache type Qwen3.5 does not use (a full RotatingKVCache, ...)
            raise TypeError(f"cannot save a {type(layer).__name__} layer")
    return _told(cache, SavedPosition(length, tuple(layers)))


def rewind(cache: CacheLayers, position: SavedPosition) -> None:
    """Put `cache` back at `position`, taken from it (or from a copy holding the same tokens up to there): KV
    layers trimmed to their length then (quantized in between or not), DeltaNet layers given their arrays back.
    The MTP head's layers are the head context's to trim (PromptCache.rewind). ValueError for another cache."""
    own = position.cache_layers
    if len(own) != len(cache):
        raise ValueError(f"a position of a {len(own)}-layer cache cannot rewind a {len(cache)}-layer one")
    for layer, then in zip(cache, own):
        if isinstance(then, KVLayer):
            layer.trim(layer.offset - then.length)
        else:
            layer.cache, layer.left_padding, layer.lengths = list(then.arrays), then.left_padding, then.lengths
    if isinstance(cache, ObservedCache) and cache.mirror is not None:
        cache.mirror.rewound(cache, position)


def save(cache: CacheLayers, tokens: Sequence[int | str], spans: Sequence[PictureSpan] = (), head: HeadPart | None = None) -> SavedPosition:
    """A detached position of a live cache that holds exactly `tokens` (the Key), with the pictures `spans` among
    them and `head`, the MTP head's context over them (HeadContext.saved). ValueError when a KV layer holds
    another count of tokens or the DeltaNet state is a batch's; TypeError for a layer that cannot be saved."""
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache

    layers: list[Layer] = []
    buffers: list[KVBuffers] = []
    kv_bytes = 0
    for c in cache:
        if isinstance(c, (KVCache, QuantizedKVCache)):
            if c.keys is None or c.offset != len(tokens):
                raise ValueError(f"a KV layer holds {c.offset} tokens, not the {len(tokens)} of the position")
            quant = (c.group_size, c.bits) if isinstance(c, QuantizedKVCache) else None
            keys, values = cast("KVArrays", c.keys), cast("KVArrays", c.values)  # mlx-lm types them as the Nones they start as
            layers.append(KVLayer(c.offset, len(buffers)))
            cls = QuantizedKVCache if quant is not None else KVCache  # mlx-lm's own (the batch's subclass: upstream.py)
            buffers.append(KVBuffers(cls, _views(keys, c.offset), _views(values, c.offset), quant))
            kv_bytes += sum(a.nbytes for a in _arrays(keys) + _arrays(values))
        elif isinstance(c, ArraysCache):
            if c.lengths is not None or c.left_padding is not None:
                raise ValueError("cannot save a batched DeltaNet cache")
            layers.append(_recurrent(c))
        else:
            raise TypeError(f"cannot save a {type(c).__name__} layer")
    mx.eval([a for b in buffers for a in _arrays(b.keys) + _arrays(b.values)])
    place = None
    if head is not None:
        place, head_layers = head
        layers.extend(head_layers)
    observed = cache if isinstance(cache, ObservedCache) else None
    mirror = observed.mirror if observed is not None else None
    kv = KVBlock(tuple(buffers), len(tokens), kv_bytes)
    return _told(cache, SavedPosition(len(tokens), tuple(layers), tuple(tokens), kv, tuple(spans), place, mirror))


def restore(position: SavedPosition) -> CacheLayers:
    """A fresh cache at a detached `position` (the model's layers; the MTP head's come back through
    HeadContext.restore): the model may append to it without touching the position. ValueError for a mark."""
    from mlx_lm.models.cache import ArraysCache

    kv = position.kv
    if kv is None:
        raise ValueError("a mark holds no KV buffers: it can only rewind the cache it was taken from")
    n = position.length
    cache: CacheLayers = []
    for layer in position.cache_layers:
        if isinstance(layer, KVLayer):
            assert layer.index is not None, "a detached position's KV layers name their buffers"
            buf = kv.layers[layer.index]
            c = buf.cls(*buf.quantization) if buf.quantization is not None else buf.cls()
            c.keys = _views(buf.keys, n)  # new array objects: writes to them never reach ours
            c.values = _views(buf.values, n)
            c.offset = n
        else:
            c = ArraysCache(len(layer.arrays))
            _set_cache(c, layer.arrays)
        cache.append(c)
    return position.mirror.restored(position, cache) if position.mirror is not None else cache
