"""A build's MTP head: its `mtp.*` tensors found, read and made into mlx-vlm's Qwen3.5 MTP drafter.

The contract with the code that fetches a head (macapp.core.download, the library's "MTP: X MB to fetch"):

- The head is the `mtp.*` tensors under the original Qwen checkpoint's names (`mtp.fc.weight`,
  `mtp.pre_fc_norm_embedding.weight`, `mtp.pre_fc_norm_hidden.weight`, `mtp.norm.weight`, `mtp.layers.0.*`),
  inside the build's own `*.safetensors` shards or in `modelfiles.mtp_side_file(model_dir)` (the shards win).
- The RMSNorm weights keep the original checkpoint's zero-centred convention (the stored value + 1 is the
  scale), as in Qwen's own safetensors; mlx-vlm's drafter `sanitize` adds the 1.
- Quantized like the build the way mlx-lm quantizes (`.weight` / `.scales` / `.biases` for a quantized Linear),
  or not at all. Each layer's bits and group size are read from its own tensors' shapes, so a layer kept at
  8 bits (mlx-lm's MoE router gates) or left unquantized needs no entry in the config.
- MoE experts: stacked `mlp.switch_mlp.{gate,up,down}_proj.*` (mlx-lm's layout, quantized or not), the
  original fused `mlp.experts.gate_up_proj` / `mlp.experts.down_proj`, or per-expert `mlp.experts.N.*`.

The drafter module itself (its forward, its own KV cache, draft_block / accept_verified_tokens) is mlx-vlm's
(`mlx_vlm.speculative.drafters.qwen3_5_mtp`), imported, not copied; it runs against mlx-lm's model here through
its `bind` (the embedding and the lm_head are the main model's).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from macapp.core.engine.mtp_policy import Verdict
from macapp.core.jsonvalue import JSONObject
from macapp.core.memory import parameter_bytes
from macapp.core.modelfiles import MTP_PREFIX, mtp_side_file, text_config

if TYPE_CHECKING:  # naming MLX's and mlx-vlm's types costs nothing at start-up
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_vlm.models.cache import KVCache
    from mlx_vlm.speculative.drafters.qwen3_5_mtp import Qwen3_5MTPDraftModel


class HeadTarget(Protocol):
    """What load_mtp_head reads of the model it loads a head for (a LoadedModel, or one being loaded)."""

    @property
    def model(self) -> nn.Module: ...  # the mlx-lm model object the head drafts for
    @property
    def config(self) -> JSONObject: ...
    @property
    def path(self) -> Path: ...


class MTPDrafter(Protocol):
    """What the engine calls on mlx-vlm's Qwen3.5 MTP drafter (Qwen3_5MTPDraftModel), loaded and bound to its model:
    its own KV cache (make_cache, reset, set_shared_kv) and a round's draft and commit (mtp_decode.py, mtp_context.py)."""

    def make_cache(self) -> list[KVCache]: ...
    def reset(self, target_model: nn.Module) -> list[KVCache]: ...  # the list it keeps as its cache from now on
    def set_shared_kv(self, shared_kv_states: dict[str, mx.array], kv_offset: int) -> None: ...
    def draft_block(self, last_bonus: int, hidden: mx.array, cache: None, block_size: int, sampler: None, *, greedy: bool) -> mx.array: ...
    def accept_verified_tokens(
        self, verify_hidden: mx.array, draft_tokens: mx.array, accepted: int, new_tokens: list[int], sampler: None, *, greedy: bool
    ) -> None: ...
    def draft_eval_state(self) -> list[object]: ...  # the arrays (and Nones) a round leaves to evaluate


class MTPHeadError(Exception):
    """The head's tensors are there but cannot be used (missing pieces, shapes that do not fit the model)."""


@dataclass
class MTPHead:
    """A loaded MTP head, bound to the main model it drafts for (`target`: the mlx-lm model object)."""

    drafter: MTPDrafter  # mlx_vlm's Qwen3_5MTPDraftModel
    target: nn.Module
    source: Path  # the file its tensors came from (a shard of the build, or the side file)
    nbytes: int  # memory its own weights take (the embedding and lm_head are the main model's)
    depth: int  # the checkpoint's mtp_num_hidden_layers
    verdict: Verdict | None = None  # whether it pays on this machine ("auto": mtp_calibration, when the build loads)


def mtp_files(model_dir: Path) -> list[Path]:
    """The files holding the build's `mtp.*` tensors: the build's own shards that have any, else the side file
    if it exists; [] when the build has no head here."""
    model_dir = Path(model_dir)
    own = [f for f in sorted(model_dir.glob("*.safetensors")) if any(k.startswith(MTP_PREFIX) for k in _tensor_names(f))]
    if own:
        return own
    side = mtp_side_file(model_dir)
    return [side] if side.is_file() and any(k.startswith(MTP_PREFIX) for k in _tensor_names(side)) else []


def _tensor_names(path: Path) -> list[str]:
    """The tensor names in a safetensors file's header (nothing else is read); [] for an unreadable file."""
    try:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
    except (OSError, ValueError, struct.error):
        return []
    return [k for k in header if k != "__metadata__"] if isinstance(header, dict) else []


def read_mtp_tensors(files: list[Path]) -> dict[str, mx.array]:
    """Every `mtp.*` tensor of `files` (mx.arrays, names as stored)."""
    import mlx.core as mx

    out: dict[str, mx.array] = {}
    for path in files:
        tensors = mx.load(str(path))
        if not isinstance(tensors, dict):  # a safetensors file loads as a dict (no metadata asked)
            raise MTPHeadError(f"{path.name} holds no named tensors")
        out.update({k: v for k, v in tensors.items() if k.startswith(MTP_PREFIX)})
    return out


def load_mtp_head(loaded: HeadTarget, model_dir: Path | None = None) -> MTPHead | None:
    """The head of the build in `model_dir` (default: the loaded model's folder), bound to `loaded.model`;
    None when the build has none (neither in its shards nor in its side file). MTPHeadError when its tensors
    do not make a head for this model."""
    model_dir = Path(model_dir if model_dir is not None else loaded.path)
    files = mtp_files(model_dir)
    if not files:
        return None
    config = text_config(loaded.config)
    depth = int(config.get("mtp_num_hidden_layers") or 1)
    drafter = _drafter(config)
    weights = drafter.sanitize(read_mtp_tensors(files))
    _quantize_like(drafter, weights)
    try:
        drafter.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise MTPHeadError(f"the MTP head in {files[0].name} does not fit this model: {exc}") from exc
    drafter.eval()
    import mlx.core as mx

    mx.eval(drafter.parameters())
    drafter.bind(loaded.model)
    nbytes = parameter_bytes(drafter)
    return MTPHead(drafter=drafter, target=loaded.model, source=files[0], nbytes=nbytes, depth=depth)


def _drafter(config: JSONObject) -> Qwen3_5MTPDraftModel:
    from mlx_vlm.speculative.drafters.qwen3_5_mtp import Model, ModelConfig

    return Model(ModelConfig.from_dict({"text_config": dict(config)}))


def _quantize_like(drafter: nn.Module, weights: dict[str, mx.array]) -> None:
    """Quantize the drafter's layers that have `.scales` in `weights`, each with the bits and group size its own
    tensors say (packed uint32 width and scales per row against the layer's input size)."""
    import mlx.nn as nn

    def spec(path: str, module: nn.Module) -> dict[str, int] | bool:
        scales = weights.get(f"{path}.scales")
        if scales is None or not hasattr(module, "to_quantized"):
            return False
        packed = weights[f"{path}.weight"]
        in_dims = module.weight.shape[-1]
        bits = packed.shape[-1] * 32 // in_dims
        group_size = in_dims // scales.shape[-1]
        return {"bits": int(bits), "group_size": int(group_size)}

    if any(k.endswith(".scales") for k in weights):
        nn.quantize(drafter, class_predicate=spec)
