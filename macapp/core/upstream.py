"""Where Qwen Desk leans on mlx-lm's and mlx-vlm's internals, beyond their documented calls: the one place.

Each touchpoint says what it relies on, what breaks when that changes, and the test that shows it (those that break
quietly have one in tests/core/test_upstream.py, which fails when the internal moves). It sits in macapp.core, below
the engine, vision, the demo model and long-context mode, so each of them may import it; it imports no MLX until a
call.

- A quantized KV cache in mlx-lm's BatchGenerator (`BatchableQuantizedKV`, `quantized_layers`): mlx-lm's
  QuantizedKVCache has no `merge`, so BatchGenerator refuses it ("does not yet support batching with
  history"); mlx-vlm has the batch cache (`mlx_vlm.models.cache.BatchQuantizedKVCache`: filter, extend,
  extract, masks) but no merge from single sequences either, and its extract returns mlx-vlm's own
  QuantizedKVCache. Relied on: BatchGenerator's `_merge_caches` calling `layer.merge(layers)` on the first
  sequence's layer, BatchQuantizedKVCache's fields (`keys`/`values` tuples of packed data, scales and biases,
  `offset`, `left_padding`, `_idx`) and mlx-lm's attention choosing the quantized kernel by `hasattr(cache,
  "bits")`. Breaks as: an insert that raises, or replies that differ batched and alone. Shown by
  tests/core/serving/test_batched.py::test_8_bit_kv_replies_batched_equal_the_same_alone.
- The token mlx-lm's BatchGenerator sampled for a sequence but has not read (`sampled_not_read`): read from
  `BatchGenerator._generation_batch.uids` / `._next_tokens`, private fields with no public call. Needed to take the
  one sequence left in the batch back to the lone executor mid-reply. Breaks as: None here, so the sequence stays
  in the batch (slower, never wrong). Shown by
  tests/core/test_upstream.py::test_sampled_not_read_is_the_token_the_batch_generator_reads_next, and
  tests/core/engine/test_solo.py (a sequence left alone goes on alone again: BatchLoop.alone_again).
- mlx-lm's sampler maths, copied (`macapp.core.sampling.filtered_logprobs`, which sits below the engine): the
  order of make_sampler's filters (top-p, min-p, top-k on log-probabilities) and its draw at the temperature.
  The seeded sampler and the MTP acceptance rule (mtp_accept.py) use it. Breaks as: MTP sampling that no longer
  follows plain decoding's distribution, a seeded reply unlike mlx-lm's distribution. Shown by
  tests/core/engine/test_mtp_accept.py (the acceptance walk's distribution against plain sampling's).
- mlx-lm's model class for a config (`text_model_classes`): `mlx_lm.utils._get_classes`, private, the lookup
  mlx-lm's own `load` makes (model_type, its remappings). The demo model builds its weights through it, so they are
  mlx-lm's own model's. Breaks as: an ImportError when the demo model (and every tiny test model) is made. Shown by
  tests/core/test_upstream.py::test_text_model_classes_are_mlx_lms_qwen3_5.
- mlx-vlm's model module for a config (`vlm_model_module`): `mlx_vlm.utils.get_model_and_args`, undocumented, the
  lookup mlx-vlm's own `load` makes; the vision runner builds its model from the module's `Model` and `ModelConfig`
  (attach_vision). Breaks as: a picture that cannot attach the tower (an ImportError or TypeError at the first
  picture). Shown by tests/core/test_upstream.py::test_vlm_model_module_is_mlx_vlms_qwen3_5.
- Qwen3.5's attention, replaced process-wide (`use_attention`): mlx-lm's qwen3_next attention (which its qwen3_5
  and qwen3_5_moe models use) calls the module-level name `scaled_dot_product_attention` (imported from
  `mlx_lm.models.base`) at call time, so rebinding that name routes every Qwen3.5 attention layer through
  long-context mode's blocked_attention, which takes and passes on base's arguments (queries, keys, values, cache,
  scale, mask, sinks). Breaks as: a silent no-op (a long prompt's chunk then materialises its whole score matrix:
  memory, not wrong answers) or a TypeError in every attention call. Shown by
  tests/core/test_upstream.py::test_use_attention_routes_qwen3_5_attention_through_the_given_function.
- mlx-vlm's video steps (`qwen_vl_video`): five private functions of `mlx_vlm.models.qwen3_vl.processing_qwen3_vl`
  (the processor's settings from a folder, its frame sizing, its bicubic frame resize, the pairs' timestamps and the
  prompt text for them), which vision/mlx_frames.py runs one frame at a time where mlx-vlm runs a clip whole.
  Breaks as: an ImportError at the first video, or a TypeError if a signature changes. Shown by
  tests/core/test_upstream.py::test_qwen_vl_video_steps_are_mlx_vlms, and tests/core/vision/test_video.py (the
  frames and prompt text equal mlx-vlm's own clip path).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, cast

from macapp.core.cache_layers import CacheLayers

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn
    import numpy as np
    from mlx_lm.models.base import BaseModelArgs
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.models.cache import QuantizedKVCache
    from mlx_vlm.models.cache import BatchQuantizedKVCache


class KVQuantization(Protocol):
    """What quantized_layers reads of the engine's KV quantization (engine.options.KVQuantization): no engine import."""

    @property
    def bits(self) -> int | None: ...

    @property
    def group_size(self) -> int: ...


def _quantized_kv_class() -> type:
    """BatchableQuantizedKV, made on first use (its bases import MLX)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _make_class()
    return _CLASS


_CLASS: type | None = None


def _make_class() -> type:
    import mlx.core as mx
    from mlx_lm.models.cache import QuantizedKVCache
    from mlx_vlm.models.cache import BatchQuantizedKVCache

    class BatchRows(BatchQuantizedKVCache):
        """mlx-vlm's batch cache, whose rows come out as mlx-lm's QuantizedKVCache (BatchableQuantizedKV)."""

        def extract(self, idx: int) -> QuantizedKVCache:
            row = super().extract(idx)  # type: ignore[no-untyped-call]  # mlx-vlm's, untyped
            out = BatchableQuantizedKV(group_size=self.group_size, bits=self.bits)
            out.keys, out.values, out.offset = row.keys, row.values, row.offset
            return out

    class BatchableQuantizedKV(QuantizedKVCache):
        """mlx-lm's QuantizedKVCache that BatchGenerator can merge into a batch (mlx-vlm's batch cache)."""

        def merge(self, caches: list[QuantizedKVCache]) -> BatchQuantizedKVCache:
            group, bits = self.group_size, self.bits
            lengths = [int(c.offset) for c in caches]
            n = max(lengths)
            batch = BatchRows([0] * len(caches) if n == 0 else [n - length for length in lengths], group_size=group, bits=bits)
            if n == 0:
                return batch
            ref = next(c for c in caches if c.keys is not None)

            def stacked(field: str) -> tuple[mx.array, ...]:
                parts = []
                for j, part in enumerate(getattr(ref, field)):
                    rows = []
                    for length, c in zip(lengths, caches):
                        if c.keys is None:
                            rows.append(mx.zeros((1, part.shape[1], n, part.shape[3]), dtype=part.dtype))
                        else:
                            rows.append(mx.pad(getattr(c, field)[j][..., :length, :], [(0, 0), (0, 0), (n - length, 0), (0, 0)]))
                    parts.append(mx.concatenate(rows))
                return tuple(parts)

            batch.keys, batch.values = stacked("keys"), stacked("values")  # type: ignore[assignment]  # typed as None
            batch.offset += n
            batch._idx = n
            return batch

    return BatchableQuantizedKV


def quantized_layers(layers: CacheLayers, kv: KVQuantization) -> CacheLayers:
    """`layers` with every full-attention layer as a BatchableQuantizedKV of `kv`'s bits and group size (what they
    hold quantized once; already quantized ones keep their arrays). For a sequence of the batch with --kv-bits,
    alone or beside others, so both read the same quantized cache."""
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    cls = _quantized_kv_class()
    bits = kv.bits or 8
    out: CacheLayers = []
    for layer in layers:
        if isinstance(layer, cls) or not isinstance(layer, (KVCache, QuantizedKVCache)):
            out.append(layer)
            continue
        if isinstance(layer, KVCache):
            layer = layer.to_quantized(group_size=kv.group_size, bits=bits) if layer.keys is not None else QuantizedKVCache(kv.group_size, bits)
        q = cls(group_size=layer.group_size, bits=layer.bits)
        q.keys, q.values, q.offset = layer.keys, layer.values, layer.offset
        out.append(q)
    return out


def sampled_not_read(gen: "BatchGenerator", uid: int) -> int | None:
    """The token mlx-lm's generator sampled for `uid` and reads at its next step; None when `uid` is not decoding
    (still reading its prompt) or this mlx-lm keeps it elsewhere (GenerationBatch's own fields: no public call)."""
    batch = getattr(gen, "_generation_batch", None)
    uids, sampled = getattr(batch, "uids", None), getattr(batch, "_next_tokens", None)
    if not isinstance(uids, list) or sampled is None or uid not in uids:
        return None
    return int(cast(int, sampled[uids.index(uid)].item()))  # a token id (mlx types item() as any scalar)


def text_model_classes(config: Mapping[str, object]) -> tuple[Callable[..., nn.Module], type[BaseModelArgs]]:
    """mlx-lm's (Model, ModelArgs) classes for a model's config.json, as its `load` picks them (ModelArgs: a dataclass
    with `from_dict`, untyped upstream)."""
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(dict(config))
    return model_class, args_class


def vlm_model_module(config: Mapping[str, object]) -> ModuleType:
    """mlx-vlm's model module (its `Model`, `ModelConfig`, `TextConfig`, `VisionConfig`) for a config.json."""
    from mlx_vlm.utils import get_model_and_args

    module, _model_type = get_model_and_args(dict(config))
    if not isinstance(module, ModuleType):
        raise TypeError(f"mlx-vlm gave {module!r} for {config.get('model_type')!r}, not a model module")
    return module


Attention = Callable[..., "mx.array"]  # mlx_lm.models.base.scaled_dot_product_attention's arguments


def use_attention(attention: Attention) -> Attention | None:
    """Route every Qwen3.5 attention layer of mlx-lm (its qwen3_next attention) through `attention`, process-wide;
    returns the function it replaced (None, and nothing replaced, when mlx-lm no longer calls it by that name)."""
    from mlx_lm.models import qwen3_next

    before: Attention | None = getattr(qwen3_next, "scaled_dot_product_attention", None)
    if before is not None:
        qwen3_next.scaled_dot_product_attention = attention
    return before


@dataclass(frozen=True)
class QwenVLVideo:
    """mlx-vlm's Qwen-VL video steps (private, untyped upstream): see vision/mlx_frames.py for their use."""

    video_kwargs: Callable[..., Any]  # (folder, default_patch_size=) -> the video processor's keyword arguments
    smart_resize: Callable[..., tuple[int, int]]  # (num_frames=, height=, width=, temporal_factor=, factor=, min_pixels=, max_pixels=) -> (h, w)
    resize_frames: Callable[..., np.ndarray]  # ((T, C, H, W) uint8 array, height, width) -> (T, C, height, width)
    group_timestamps: Callable[..., list[float]]  # (groups, temporal_patch_size, fps, metadata) -> seconds per group
    timestamped_placeholder: Callable[..., str]  # (seconds, tokens_per_group, start, end) -> text with <|placeholder|>


@functools.cache
def qwen_vl_video() -> QwenVLVideo:
    """mlx-vlm's Qwen-VL video steps, looked up once."""
    from mlx_vlm.models.qwen3_vl import processing_qwen3_vl as p

    return QwenVLVideo(
        video_kwargs=p._qwen_vl_video_kwargs,
        smart_resize=p._smart_resize_video,
        resize_frames=p._resize_video_frames,
        group_timestamps=p._video_group_timestamps,
        timestamped_placeholder=p._timestamped_video_placeholder,
    )
