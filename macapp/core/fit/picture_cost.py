"""What pictures cost in memory: the vision tower's weights and one picture's activations at the processor's maximum.

- `tower_bytes_from_config`: the Qwen3.5 (Qwen3-VL style) tower's parameters from its `vision_config`:
  a Conv3d patch embedding, learnt position embeddings, `depth` pre-norm blocks (LayerNorm, fused qkv
  attention, GELU MLP, all with biases) and a 2x2 patch merger. MLX conversions keep the tower unquantized
  (mlx-vlm skips it when quantizing), so the bytes are params x the checkpoint dtype (bf16: 2). The exact
  figure, when the files are known, comes from the safetensors headers (`capability.folder_support`).
- `image_activation_bytes`: the tower runs over every patch of the picture at once (attention is MLX's
  fused kernel, so no N x N score matrix): the processor's float32 pixels, the patch embeddings, and a
  block's widest moment (qkv, the MLP's hidden layer, the residual) in the tower's dtype, plus the merged
  image tokens handed to the language model. Those tokens then count as prompt tokens (the prefill chunk).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from macapp.core.jsonvalue import JSONObject
from macapp.core.modelfiles import text_config

PIXEL_BYTES = 4  # the processor hands float32 pixel values
DEFAULT_MAX_PIXELS = 16_777_216  # Qwen3.5's preprocessor_config.json: size.longest_edge
DEFAULT_MIN_PIXELS = 65_536


@dataclass(frozen=True)
class ProcessorLimits:
    """The image processor's pixel range and geometry (preprocessor_config.json)."""

    max_pixels: int = DEFAULT_MAX_PIXELS
    min_pixels: int = DEFAULT_MIN_PIXELS
    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2

    @property
    def pixels_per_token(self) -> int:
        return (self.patch_size * self.merge_size) ** 2

    @property
    def max_image_tokens(self) -> int:
        return self.max_pixels // self.pixels_per_token

    @classmethod
    def from_files(cls, folder: Path) -> "ProcessorLimits":
        """From a model folder's preprocessor_config.json (processor_config.json's image part overrides), defaults otherwise."""
        raw: JSONObject = {}
        for name in ("preprocessor_config.json", "processor_config.json"):
            try:
                data = json.loads((Path(folder) / name).read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict):
                raw.update(data.get("image_processor", data) if name == "processor_config.json" else data)
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: JSONObject) -> "ProcessorLimits":
        size_field = raw.get("size")
        size: JSONObject = size_field if isinstance(size_field, dict) else {}
        base = cls()

        def positive(value: object, default: int) -> int:
            return int(value) if isinstance(value, (int, float)) and value > 0 else default

        return cls(
            max_pixels=positive(raw.get("max_pixels") or size.get("longest_edge"), base.max_pixels),
            min_pixels=positive(raw.get("min_pixels") or size.get("shortest_edge"), base.min_pixels),
            patch_size=positive(raw.get("patch_size"), base.patch_size),
            merge_size=positive(raw.get("merge_size"), base.merge_size),
            temporal_patch_size=positive(raw.get("temporal_patch_size"), base.temporal_patch_size),
        )


def _int(config: JSONObject, key: str, default: int) -> int:
    """A whole-number field of a vision config, `default` when absent; TypeError (as int() gives) for a non-number."""
    value = config.get(key, default)
    if not isinstance(value, (int, float, str)):
        raise TypeError(f"vision config field {key!r} must be a number, not {value!r}")
    return int(value)


def tower_parameters(vision_config: JSONObject) -> int:
    """Parameter count of a Qwen3.5 vision tower from its config."""
    h = _int(vision_config, "hidden_size", 0)
    inter = _int(vision_config, "intermediate_size", 0)
    depth = _int(vision_config, "depth", 0)
    if not (h and inter and depth):
        return 0
    patch = _int(vision_config, "patch_size", 16)
    temporal = _int(vision_config, "temporal_patch_size", 2)
    channels = _int(vision_config, "in_channels", 3)
    merge = _int(vision_config, "spatial_merge_size", 2)
    out = _int(vision_config, "out_hidden_size", h)
    positions = _int(vision_config, "num_position_embeddings", 2304)
    patch_embed = h * channels * temporal * patch * patch + h
    block = 2 * (2 * h) + (h * 3 * h + 3 * h) + (h * h + h) + (h * inter + inter) + (inter * h + h)
    merged = h * merge * merge
    merger = 2 * h + (merged * merged + merged) + (merged * out + out)
    indexes = vision_config.get("deepstack_visual_indexes")
    deepstack = (len(indexes) if isinstance(indexes, list) else 0) * (2 * merged + merged * merged + merged + merged * out + out)
    return patch_embed + positions * h + depth * block + merger + deepstack


def tower_bytes_from_config(vision_config: JSONObject, dtype_bytes: int = 2) -> int:
    return tower_parameters(vision_config) * dtype_bytes


def image_activation_bytes(vision_config: JSONObject, limits: ProcessorLimits, dtype_bytes: int = 2, text_hidden: int | None = None) -> int:
    """Peak activation memory of the tower encoding one picture at the processor's maximum size."""
    h = _int(vision_config, "hidden_size", 0)
    inter = _int(vision_config, "intermediate_size", 0)
    if not (h and inter):
        return 0
    patches = limits.max_pixels // (limits.patch_size**2)
    channels = _int(vision_config, "in_channels", 3)
    pixels = patches * channels * limits.temporal_patch_size * limits.patch_size**2 * PIXEL_BYTES
    widest_block = patches * (h + 3 * h + inter + h) * dtype_bytes  # residual + qkv + MLP hidden + output
    tokens = patches // (limits.merge_size**2)
    out = _int(vision_config, "out_hidden_size", text_hidden or h)
    merged = tokens * (h * limits.merge_size**2 * 2 + out) * dtype_bytes
    return pixels + widest_block + merged


def checkpoint_dtype_bytes(config: JSONObject) -> int:
    dtype = str(config.get("torch_dtype") or config.get("dtype") or text_config(config).get("dtype") or "bfloat16")
    return 4 if "32" in dtype else 2


@dataclass(frozen=True)
class VisionCost:
    """What a build's pictures add to the fit: 0s for a text-only build."""

    vision_bytes: int = 0  # the tower's weights
    image_activation_bytes: int = 0  # one picture at the processor's maximum, while it is encoded
    max_image_tokens: int = 0  # prompt tokens one such picture takes
    exact: bool = False  # vision_bytes read from the safetensors headers

    @property
    def total_bytes(self) -> int:
        return self.vision_bytes + self.image_activation_bytes


def vision_cost(config: JSONObject, limits: ProcessorLimits | None = None, tower_bytes: int | None = None) -> VisionCost:
    """The cost from a config (and the exact tower bytes when the headers were read)."""
    vision_config = config.get("vision_config")
    if not isinstance(vision_config, dict) or not vision_config:
        return VisionCost()
    limits = limits or ProcessorLimits.from_dict({"patch_size": vision_config.get("patch_size", 16)})
    dtype_bytes = checkpoint_dtype_bytes(config)
    text_hidden = text_config(config).get("hidden_size")
    computed = tower_bytes_from_config(vision_config, dtype_bytes)
    return VisionCost(
        vision_bytes=int(tower_bytes) if tower_bytes is not None else computed,
        image_activation_bytes=image_activation_bytes(vision_config, limits, dtype_bytes, text_hidden),
        max_image_tokens=limits.max_image_tokens,
        exact=tower_bytes is not None,
    )
