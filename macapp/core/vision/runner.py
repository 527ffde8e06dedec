"""The mlx-vlm side of a chat: pictures encoded once, then fed through mlx-lm's own generation loop.

Call everything here on the engine's worker thread (MLX streams are per thread). mlx-vlm is imported here only.

- `attach_vision(text_model, path)`: builds mlx-vlm's own Qwen3.5 model class for the folder, but its language
  model takes the ARRAYS of the mlx-lm model already loaded (quantized the same way first), and only the
  ``vision_tower.*`` tensors are read from the files. So pictures cost the tower's bytes, never a second
  copy of the weights, and text-only chats keep running on mlx-lm untouched.
- `VisionModel.encode(prefix_tokens, text, images)`: the processor turns the templated text (with one
  ``<|image_pad|>`` per picture) and the pictures into token ids with the right number of image tokens; the
  tower runs once, its features are scattered into the token embeddings, and the turn's 3-D mRoPE positions
  (time, row, column for image tokens) are computed. An `EncodedTurn` holds all three.
- `PositionedLM`: the language model as mlx-lm's `stream_generate` wants a model (``model(tokens, cache=,
  input_embeddings=)`` → logits) with explicit mRoPE positions: a queued `EncodedTurn`'s positions while its
  prompt is read, then ``cache length + delta`` for every later token (the delta is how far the image
  tokens' compact positions pulled the sequence back). Text after a picture thus gets the positions
  Qwen3.5 was trained with, and the same prompt cache grows turn after turn: a follow-up question about
  the same picture reads only its own tokens; the picture is never encoded again.
- Before any picture, a conversation's positions equal its cache length (delta 0): mlx-lm's text model and
  this one compute the same thing (tests/core/vision/test_runner.py checks the logits), so a session that
  was text-only on mlx-lm continues with a picture on the same cache.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import mlx.core as mx
import mlx.nn as nn

from macapp.core.modelfiles import read_safetensors_header
from macapp.core.vision.capability import is_tower_tensor
from macapp.core.vision.cost import ProcessorLimits
from macapp.core.vision.images import PreparedImage


class VisionLoadError(RuntimeError):
    pass


@dataclass
class EncodedTurn:
    """A turn's prompt with its pictures encoded: what PositionedLM and stream_generate need."""

    tokens: list[int]
    embeddings: Any  # mx.array (L, hidden)
    positions: Any  # mx.array (3, 1, L), relative to the turn's first token
    image_tokens: int
    encode_s: float  # processor + tower time

    @property
    def delta(self) -> int:
        """How far this turn moves positions behind the token count (<= 0 with pictures, 0 without)."""
        return int(self.positions.max().item()) + 1 - len(self.tokens)


@dataclass
class _Delta:
    start: int  # cache length where the turn began
    end: int  # cache length once its prompt is read
    delta: int  # positions = length + delta from `end` on


class PositionedLM(nn.Module):
    """mlx-vlm's language model, called the way mlx-lm's generate loop calls a model, with explicit mRoPE positions."""

    def __init__(self, language_model: nn.Module):
        super().__init__()
        self.language_model = language_model
        self._deltas: list[_Delta] = []  # per session: see bind()
        self._queued: EncodedTurn | None = None
        self._queued_start = 0

    # A session's position bookkeeping lives with its cache: bind() swaps it in before a turn.
    def bind(self, deltas: list[_Delta]) -> None:
        self._deltas = deltas
        self._queued = None

    def queue(self, turn: EncodedTurn, cache: list) -> None:
        """The next prompt read through this model is `turn` (prefix + pictures), starting at the cache's length."""
        self._queued = turn
        self._queued_start = cache_length(cache)

    def forget_after(self, length: int) -> None:
        """The cache was restored to `length` (regenerate / edit): drop the turns read after it."""
        self._deltas[:] = [d for d in self._deltas if d.start < length]

    def delta_at(self, length: int) -> int:
        delta = 0
        for d in self._deltas:
            if d.end <= length:
                delta += d.delta
        return delta

    def make_cache(self) -> list:
        return self.language_model.make_cache()

    @property
    def layers(self):
        return self.language_model.layers

    def __call__(self, inputs, cache=None, input_embeddings=None):
        length = inputs.shape[1]
        start = cache_length(cache)
        turn = self._queued
        if turn is not None and start >= self._queued_start and start - self._queued_start < len(turn.tokens):
            offset = start - self._queued_start
            base = self._queued_start + self.delta_at(self._queued_start)
            positions = turn.positions[:, :, offset : offset + length] + base
            if offset + length >= len(turn.tokens):
                self._deltas.append(_Delta(self._queued_start, self._queued_start + len(turn.tokens), turn.delta))
                self._queued = None
        else:
            first = start + self.delta_at(start)
            positions = mx.broadcast_to(mx.arange(first, first + length)[None, None, :], (3, inputs.shape[0], length))
        out = self.language_model(inputs, inputs_embeds=input_embeddings, cache=cache, position_ids=positions)
        return out.logits


def cache_length(cache: list | None) -> int:
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
    config: dict = field(repr=False, default_factory=dict)

    def image_token_count(self, image: PreparedImage) -> int:
        """How many prompt tokens the processor will give this picture (no pixels processed)."""
        from mlx_vlm.utils import estimate_num_image_tokens

        width, height = image.size
        return estimate_num_image_tokens(self.processor, height, width)

    def encode(self, prefix_tokens: Sequence[int], text: str, images: Sequence[PreparedImage]) -> EncodedTurn:
        """Prefix token ids + templated text holding one image placeholder per picture → an EncodedTurn."""
        start = time.perf_counter()
        pictures = [image.image for image in images] or None
        inputs = self.processor(text=[text], images=pictures, padding=False, return_tensors="mlx")
        ids = mx.array(inputs["input_ids"]).reshape(1, -1).astype(mx.int32)
        if prefix_tokens:
            ids = mx.concatenate([mx.array([list(prefix_tokens)], dtype=mx.int32), ids], axis=1)
        pixel_values = inputs.get("pixel_values")
        grid = inputs.get("image_grid_thw")
        features = self.model.get_input_embeddings(
            ids,
            mx.array(pixel_values) if pixel_values is not None else None,
            image_grid_thw=mx.array(grid) if grid is not None else None,
        )
        embeddings = features.inputs_embeds[0]
        positions = features.position_ids
        if positions is None or positions.ndim != 3:
            positions = mx.broadcast_to(mx.arange(ids.shape[1])[None, None, :], (3, 1, ids.shape[1]))
        mx.eval(embeddings, positions)
        tokens = ids[0].tolist()
        return EncodedTurn(
            tokens=tokens,
            embeddings=embeddings,
            positions=positions.astype(mx.int32),
            image_tokens=sum(1 for t in tokens if t == self.image_token_id),
            encode_s=time.perf_counter() - start,
        )


def _quantize_like(target: nn.Module, source: nn.Module) -> None:
    """Quantize `target`'s layers exactly where (and how) the mlx-lm `source` was quantized."""
    specs = {}
    for path, module in source.named_modules():
        if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            specs[path] = {"group_size": module.group_size, "bits": module.bits, "mode": getattr(module, "mode", "affine")}
    if specs:
        nn.quantize(target, class_predicate=lambda path, _module: specs.get(path, False))


def _tower_weights(path: Path) -> dict:
    """Only the vision tower's tensors from the folder's safetensors files (others are never read)."""
    weights = {}
    for file in sorted(path.glob("*.safetensors")):
        if any(is_tower_tensor(name) for name in read_safetensors_header(file).tensors):
            loaded = mx.load(str(file))
            weights.update({k: v for k, v in loaded.items() if is_tower_tensor(k)})
            del loaded
    return weights


def attach_vision(text_model: nn.Module, path: str | Path) -> VisionModel:
    """An mlx-vlm model for the folder whose language model shares `text_model`'s (an mlx-lm Qwen3.5) arrays."""
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import get_model_and_args, load_config, load_image_processor, load_processor, sanitize_weights

    start = time.perf_counter()
    path = Path(path)
    config = load_config(path)
    model_module, _ = get_model_and_args(config)
    model_config = model_module.ModelConfig.from_dict(config)
    model = model_module.Model(model_config)
    _quantize_like(model.language_model, text_model.language_model)
    try:
        model.language_model.load_weights(list(tree_flatten(text_model.language_model.parameters())), strict=True)
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
    vision_bytes = sum(v.nbytes for _, v in tree_flatten(model.vision_tower.parameters()))
    return VisionModel(
        model=model,
        processor=processor,
        lm=PositionedLM(model.language_model),
        limits=ProcessorLimits.from_files(path),
        vision_bytes=int(vision_bytes),
        load_s=time.perf_counter() - start,
        image_token_id=int(model.config.image_token_id),
        config=json.loads((path / "config.json").read_text()),
    )
