"""The mlx-vlm side of a chat: pictures encoded once, then fed through mlx-lm's own generation loop.

Call everything here on the engine's worker thread (MLX streams are per thread). mlx-vlm is imported here only.

- `attach_vision(text_model, path)`: builds mlx-vlm's own Qwen3.5 model class for the folder, but its language
  model takes the ARRAYS of the mlx-lm model already loaded (quantized the same way first), and only the
  ``vision_tower.*`` tensors are read from the files. So pictures cost the tower's bytes, never a second
  copy of the weights, and text-only chats keep running on mlx-lm untouched.
- `VisionModel.encode(tokens, images)`: the prompt's tokens as the chat template wrote them (one
  ``<|image_pad|>`` per picture) are widened to each picture's image-token count by the real image processor
  (its grid), the tower runs once, its features are scattered into the token embeddings, and the turn's 3-D
  mRoPE positions (time, row, column for image tokens) are computed. An `EncodedTurn` holds all three.
- `PositionedLM`: the language model as mlx-lm's `stream_generate` wants a model (``model(tokens, cache=,
  input_embeddings=)`` → logits) on mlx-lm's own prompt cache, with explicit mRoPE positions: a queued
  `EncodedTurn`'s positions while its prompt is read, then ``cache index + delta`` for every later token (the
  delta is how far the image tokens' compact positions pulled the sequence back). Text after a picture thus
  gets the positions Qwen3.5 was trained with, and the same prompt cache grows turn after turn: a follow-up
  question about the same picture reads only its own tokens; the picture is never encoded again.
- Before any picture, a conversation's positions equal its cache length (delta 0): mlx-lm's text model and
  this one compute the same thing (tests/core/vision/test_runner.py checks the logits), so a session that
  was text-only on mlx-lm continues with a picture on the same cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from macapp.core.cache_layers import CacheLayers
from macapp.core.modelfiles import read_safetensors_header
from macapp.core.upstream import vlm_model_module
from macapp.core.vision.capability import VisionLoadError, is_tower_tensor
from macapp.core.fit.picture_cost import ProcessorLimits
from macapp.core.vision.images import PreparedImage
from macapp.core.vision.spans import PictureSpan
from macapp.core.vision.video import PreparedVideo

if TYPE_CHECKING:
    from mlx_vlm.models import cache as vlm_cache


@dataclass
class EncodedTurn:
    """A turn's prompt with its pictures encoded: what PositionedLM and stream_generate need."""

    tokens: list[int]
    embeddings: mx.array  # (L, hidden)
    positions: mx.array  # (3, 1, L), relative to the turn's first token
    image_tokens: int
    encode_s: float  # processor + tower time

    @property
    def delta(self) -> int:
        """How far this turn moves positions behind the token count (<= 0 with pictures, 0 without)."""
        return int(self.positions.max()) + 1 - len(self.tokens)


class PositionedLM(nn.Module):
    """mlx-vlm's language model, called the way mlx-lm calls a model (``model(tokens, cache=, input_embeddings=)``
    → logits) on an mlx-lm prompt cache, with explicit mRoPE positions.

    Positions: inside a span queued by `queue` (a turn with pictures) the span's own; elsewhere the cache index
    plus the deltas of the spans before it. The spans belong to a session: `bind` swaps its list in before a turn,
    `forget_after` drops those a restored cache no longer holds. The mlx-lm cache layers are mirrored into
    mlx-vlm's cache classes for the call (their arrays shared, not copied) and read back after it, so the
    session's cache, its snapshots and mlx-lm's own loop stay exactly as for text.
    """

    def __init__(self, language_model: nn.Module):
        super().__init__()  # type: ignore[no-untyped-call]  # mlx's Module.__init__ carries no annotations
        self.language_model = language_model
        self._spans: list[PictureSpan] = []

    def bind(self, spans: list[PictureSpan]) -> None:
        self._spans = spans

    def queue(self, turn: EncodedTurn, cache: CacheLayers) -> None:
        """`turn` (prefix + pictures) is read next, from the cache's current length."""
        start = cache_length(cache)
        base = start + self._delta_before(start)
        self._spans.append(PictureSpan(start, start + len(turn.tokens), turn.positions + base, turn.delta, base))

    def forget_after(self, length: int) -> None:
        """The cache was restored to `length` tokens (regenerate / edit): drop the spans read after it."""
        self._spans[:] = [span for span in self._spans if span.start < length]

    @property
    def has_pictures(self) -> bool:
        return bool(self._spans)

    def _delta_before(self, index: int) -> int:
        return sum(span.delta for span in self._spans if span.end <= index)

    def positions(self, start: int, length: int) -> mx.array:
        """mRoPE positions (3, 1, length) of cache indices [start, start + length)."""
        pieces: list[mx.array] = []
        i, end = start, start + length
        for span in sorted(self._spans, key=lambda s: s.start):
            if span.end <= i or span.start >= end:
                continue
            if span.start > i:
                pieces.append(self._text_positions(i, span.start))
                i = span.start
            stop = min(end, span.end)
            pieces.append(span.positions[:, :, i - span.start : stop - span.start])
            i = stop
        if i < end:
            pieces.append(self._text_positions(i, end))
        return pieces[0] if len(pieces) == 1 else mx.concatenate(pieces, axis=2)

    def _text_positions(self, i: int, j: int) -> mx.array:
        first = i + self._delta_before(i)
        return mx.broadcast_to(mx.arange(first, first + j - i)[None, None, :], (3, 1, j - i))

    def make_cache(self) -> CacheLayers:
        from mlx_lm.models.cache import ArraysCache, KVCache

        return [ArraysCache(size=2) if layer.is_linear else KVCache() for layer in self.language_model.model.layers]

    @property
    def layers(self) -> list[nn.Module]:
        layers: list[nn.Module] = self.language_model.model.layers
        return layers

    def __call__(self, inputs: mx.array, cache: CacheLayers | None = None, input_embeddings: mx.array | None = None) -> mx.array:
        start = cache_length(cache)
        positions = self.positions(start, inputs.shape[1])
        if inputs.shape[0] > 1:
            positions = mx.broadcast_to(positions, (3, inputs.shape[0], inputs.shape[1]))
        mirrored = None if cache is None else [_to_vlm(layer) for layer in cache]
        out = self.language_model(inputs, inputs_embeds=input_embeddings, cache=mirrored, position_ids=positions)
        for layer, twin in zip(cache or (), mirrored or ()):
            _from_vlm(layer, twin)
        logits: mx.array = out.logits
        return logits


def _to_vlm(layer: object) -> vlm_cache.ArraysCache | vlm_cache.KVCache | vlm_cache.QuantizedKVCache:
    """An mlx-vlm cache layer holding the same arrays as an mlx-lm one."""
    from mlx_lm.models import cache as lm_cache
    from mlx_vlm.models import cache as vlm_cache

    if isinstance(layer, lm_cache.ArraysCache):
        twin = vlm_cache.ArraysCache(size=len(layer.cache))
        twin.cache = layer.cache  # the same list: the layer writes its new state into it
        return twin
    kv: vlm_cache.KVCache | vlm_cache.QuantizedKVCache
    if isinstance(layer, lm_cache.QuantizedKVCache):
        kv = vlm_cache.QuantizedKVCache(group_size=layer.group_size, bits=layer.bits)
    elif isinstance(layer, lm_cache.KVCache):
        kv = vlm_cache.KVCache()
    else:  # pragma: no cover - a cache type Qwen3.5 does not use
        raise TypeError(f"cannot run pictures on a {type(layer).__name__}")
    kv.keys, kv.values, kv.offset = layer.keys, layer.values, layer.offset
    return kv


def _from_vlm(layer: object, twin: vlm_cache.ArraysCache | vlm_cache.KVCache | vlm_cache.QuantizedKVCache) -> None:
    """What mlx-vlm's `twin` (_to_vlm's) read, back into the mlx-lm `layer`."""
    from mlx_lm.models import cache as lm_cache
    from mlx_vlm.models import cache as vlm_cache

    if isinstance(layer, lm_cache.ArraysCache) and isinstance(twin, vlm_cache.ArraysCache):
        layer.cache = twin.cache
    elif isinstance(layer, (lm_cache.KVCache, lm_cache.QuantizedKVCache)) and not isinstance(twin, vlm_cache.ArraysCache):
        layer.keys, layer.values, layer.offset = twin.keys, twin.values, twin.offset
    else:  # pragma: no cover - _to_vlm made every twin of its layer's kind
        raise TypeError(f"a {type(twin).__name__} cannot go back into a {type(layer).__name__}")


def cache_length(cache: CacheLayers | None) -> int:
    """Tokens in a prompt cache (its attention layers' offset)."""
    for entry in cache or ():
        offset = getattr(entry, "offset", None)
        if isinstance(offset, int):
            return offset
    return 0


@dataclass
class VisionModel:
    """The vision tower, processor and positioned language model attached to one loaded mlx-lm model."""

    model: Any  # mlx_vlm Qwen3.5 Model (its language model shares the mlx-lm arrays)
    processor: Any
    lm: PositionedLM
    limits: ProcessorLimits
    vision_bytes: int  # the tower's weights, read from the files
    load_s: float
    image_token_id: int
    video_token_id: int = -1
    pictures_encoded: int = 0  # pictures the tower has run on, since it was attached

    def image_token_count(self, image: PreparedImage) -> int:
        """How many prompt tokens the processor will give this picture (no pixels processed); a video: all its
        video tokens (`slot_counts`)."""
        return sum(self.slot_counts(image))

    def slot_counts(self, item: PreparedImage) -> list[int]:
        """The tokens each of an item's placeholder slots widens to: one slot for a picture; one per pair of frames
        for a video (engine.pictures.content_of writes each pair's timestamp and placeholder), none processed."""
        if isinstance(item, PreparedVideo):
            return [item.plan.tokens_per_group] * len(item.plan.group_seconds)
        from mlx_vlm.utils import estimate_num_image_tokens

        width, height = item.size
        return [int(estimate_num_image_tokens(self.processor, height, width))]

    @property
    def slot_token_ids(self) -> tuple[int, int]:
        return (self.image_token_id, self.video_token_id)

    def encode(self, tokens: Sequence[int], images: Sequence[PreparedImage]) -> EncodedTurn:
        """Prompt tokens holding one ``<|image_pad|>`` per picture and one ``<|video_pad|>`` per pair of a video's
        frames (as the chat template writes them), in order → an EncodedTurn: each placeholder widened to its
        tokens, the tower run once over the pictures (or the videos: mlx-vlm's Qwen3.5 reads one kind per call),
        its features in the embeddings, and the 3-D mRoPE positions."""
        start = time.perf_counter()
        tokens = list(tokens)
        slots = [i for i, t in enumerate(tokens) if t in self.slot_token_ids]
        counts = [count for image in images for count in self.slot_counts(image)]
        if len(slots) != len(counts):
            raise ValueError(f"the prompt has {len(slots)} picture and video placeholders for {len(counts)}")
        videos = [image for image in images if isinstance(image, PreparedVideo)]
        if videos and len(videos) != len(images):
            raise ValueError("a message takes pictures or videos, not both: send them in separate messages")
        inputs: dict[str, mx.array] = {}
        if images:
            self.pictures_encoded += len(images)
            if videos:
                processed = self.processor.video_processor(videos=[v.pixels for v in videos], video_metadata=[v.metadata for v in videos])
                grid = mx.array(processed["video_grid_thw"])
                inputs = {"pixel_values_videos": mx.array(processed["pixel_values_videos"]), "video_grid_thw": grid}
                merge = self.processor.video_processor.merge_size**2
                given = [n // merge for n in _int_list(mx.prod(grid, axis=-1))]
                planned = [sum(self.slot_counts(v)) for v in videos]
            else:
                processed = self.processor.image_processor(images=[image.image for image in images])
                grid = mx.array(processed["image_grid_thw"])
                inputs = {"pixel_values": mx.array(processed["pixel_values"]), "image_grid_thw": grid}
                merge = self.processor.image_processor.merge_size**2
                given = [int(n) // merge for n in _int_list(mx.prod(grid, axis=-1))]
                planned = given
            if given != planned:
                raise ValueError(f"the processor gave {given} vision tokens where the plan said {planned}")
            widened: list[int] = []
            last = 0
            for slot, count in zip(slots, counts):
                widened += tokens[last:slot] + [tokens[slot]] * count
                last = slot + 1
            tokens = widened + tokens[last:]
        ids = mx.array([tokens], dtype=mx.int32)
        features = self.model.get_input_embeddings(ids, inputs.pop("pixel_values", None), **inputs)
        embeddings = features.inputs_embeds[0]
        positions = features.position_ids
        if positions is None or positions.ndim != 3:
            positions = mx.broadcast_to(mx.arange(len(tokens))[None, None, :], (3, 1, len(tokens)))
        mx.eval(embeddings, positions)
        return EncodedTurn(
            tokens=tokens,
            embeddings=embeddings,
            positions=positions.astype(mx.int32),
            image_tokens=sum(1 for t in tokens if t in self.slot_token_ids),
            encode_s=time.perf_counter() - start,
        )


def _int_list(values: mx.array) -> list[int]:
    """A 1-D array's values as Python ints."""
    items = values.tolist()
    if not isinstance(items, list):
        raise TypeError(f"expected a 1-D array, got shape {values.shape}")
    return [int(x) for x in items]  # type: ignore[arg-type]  # mlx types tolist() as a nested union of scalars


def _flat_parameters(module: nn.Module) -> list[tuple[str, mx.array]]:
    """`module`'s parameters as (dotted name, array) pairs."""
    flat = tree_flatten(module.parameters())
    if not isinstance(flat, list):  # tree_flatten returns its destination, a list unless one is given
        raise TypeError("tree_flatten returned a dict")
    return flat


def _quantize_like(target: nn.Module, source: nn.Module) -> None:
    """Quantize `target`'s layers exactly where (and how) the mlx-lm `source` was quantized."""
    specs = {}
    for path, module in source.named_modules():
        if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            specs[path] = {"group_size": module.group_size, "bits": module.bits, "mode": getattr(module, "mode", "affine")}
    if specs:
        nn.quantize(target, class_predicate=lambda path, _module: specs.get(path, False))


def _tower_weights(path: Path) -> dict[str, mx.array]:
    """Only the vision tower's tensors from the folder's safetensors files (others are never read)."""
    weights: dict[str, mx.array] = {}
    for file in sorted(path.glob("*.safetensors")):
        if any(is_tower_tensor(name) for name in read_safetensors_header(file).tensors):
            loaded = mx.load(str(file))
            if not isinstance(loaded, dict):  # a .safetensors file loads as {name: array}
                raise VisionLoadError(f"{file} did not load as named tensors")
            weights.update({k: v for k, v in loaded.items() if is_tower_tensor(k)})
            del loaded
    return weights


def attach_vision(text_model: nn.Module, path: str | Path) -> VisionModel:
    """An mlx-vlm model for the folder whose language model shares `text_model`'s (an mlx-lm Qwen3.5) arrays."""
    from mlx_vlm.utils import load_config, load_image_processor, load_processor, sanitize_weights

    start = time.perf_counter()
    path = Path(path)
    config = load_config(path)
    model_module = vlm_model_module(config)
    model_config = model_module.ModelConfig.from_dict(config)
    model = model_module.Model(model_config)
    _quantize_like(model.language_model, text_model.language_model)
    try:
        model.language_model.load_weights(_flat_parameters(text_model.language_model), strict=True)
    except ValueError as exc:
        raise VisionLoadError(f"the text model in {path} does not match mlx-vlm's Qwen3.5 ({exc})") from exc
    tower = _tower_weights(path)
    if not tower:
        raise VisionLoadError(f"{path} holds no vision tower weights (a text-only conversion)")
    tower = sanitize_weights(model, tower)
    tower = model.vision_tower.sanitize(tower) if hasattr(model.vision_tower, "sanitize") else tower
    tower = {k.removeprefix("vision_tower."): v for k, v in tower.items()}
    if any(k.endswith(".scales") for k in tower):
        scaled = {k.removesuffix(".scales") for k in tower if k.endswith(".scales")}
        quant = config.get("quantization") or {}
        nn.quantize(
            model.vision_tower,
            group_size=int(quant.get("group_size", 64)),
            bits=int(quant.get("bits", 4)),
            class_predicate=lambda p, _m: p in scaled,
        )
    try:
        model.vision_tower.load_weights(list(tower.items()), strict=True)
    except ValueError as exc:
        raise VisionLoadError(f"the vision tower in {path} does not match its vision_config ({exc})") from exc
    mx.eval(model.vision_tower.parameters())
    model.eval()
    image_processor = load_image_processor(path)
    processor = load_processor(path, True, eos_token_ids=getattr(model.config, "eos_token_id", None))
    if image_processor is not None:
        processor.image_processor = image_processor
    vision_bytes = sum(v.nbytes for _, v in _flat_parameters(model.vision_tower))
    return VisionModel(
        model=model,
        processor=processor,
        lm=PositionedLM(model.language_model),
        limits=ProcessorLimits.from_files(path),
        vision_bytes=int(vision_bytes),
        load_s=time.perf_counter() - start,
        image_token_id=int(model.config.image_token_id),
        video_token_id=int(getattr(model.config, "video_token_id", -1)),
    )
