"""What each tensor of a Qwen3.5 checkpoint is for: the language model, the vision tower, the MTP head, or none.

One rule for every caller (sizes in the catalog, "can it see" in vision, the MTP head's bytes), mirroring the
loaders' own `sanitize` for qwen3_5 and qwen3_5_moe:

- mlx-lm (`mlx_lm/models/qwen3_5.py`, `qwen3_5_moe.py`) drops keys starting ``vision_tower`` or ``model.visual``,
  then every key containing ``mtp.``, and pops ``lm_head.weight`` when the embeddings are tied;
- mlx-vlm (`mlx_vlm/models/qwen3_5*/`) drops the ``mtp.`` keys first and maps ``model.language_model.visual`` and
  ``model.visual`` to ``vision_tower`` (its tower), everything else to the language model.

The two agree except on ``model.language_model.visual.*``: mlx-vlm loads it as the tower, mlx-lm would take it for
a language-model key (and fail on it). It is tower weight either way, so it counts as the tower here. Pure: no MLX.
"""

from __future__ import annotations

import enum
from typing import Iterable

from macapp.core.jsonvalue import JSONObject

MTP_MARK = "mtp."  # both loaders drop any key that contains it
VISION_PREFIXES = ("vision_tower", "model.visual", "model.language_model.visual")
TIED_LM_HEADS = ("lm_head.weight", "language_model.lm_head.weight")


class TensorRole(enum.StrEnum):
    LANGUAGE = "language"  # what mlx-lm loads
    VISION = "vision"  # the vision tower (mlx-vlm loads it; mlx-lm drops it)
    MTP = "mtp"  # the multi-token-prediction head (both loaders drop it)
    OTHER = "other"  # dropped by both and needed by neither (an lm_head the tied embeddings replace)


def tensor_role(name: str, tied_embeddings: bool = False) -> TensorRole:
    """The role of one tensor, by its name in the safetensors files (any of the layouts above)."""
    if name.startswith(VISION_PREFIXES):
        return TensorRole.VISION
    if MTP_MARK in name:
        return TensorRole.MTP
    if tied_embeddings and name in TIED_LM_HEADS:
        return TensorRole.OTHER
    return TensorRole.LANGUAGE


def is_tower_tensor(name: str) -> bool:
    return tensor_role(name) is TensorRole.VISION


def is_mtp_tensor(name: str) -> bool:
    return tensor_role(name) is TensorRole.MTP


def loaded_by_mlx_lm(name: str, tied_embeddings: bool = False) -> bool:
    return tensor_role(name, tied_embeddings) is TensorRole.LANGUAGE


def bytes_by_role(tensors: Iterable[tuple[str, int]], tied_embeddings: bool = False) -> dict[TensorRole, int]:
    """Bytes per role (every role present, 0 when none) of (tensor name, bytes) pairs."""
    totals = {role: 0 for role in TensorRole}
    for name, nbytes in tensors:
        totals[tensor_role(name, tied_embeddings)] += int(nbytes)
    return totals


def tied_embeddings(config: JSONObject) -> bool:
    """Whether the config ties lm_head to the embeddings (the text settings win over the top level, as mlx-lm reads)."""
    nested = config.get("text_config")
    text = nested if isinstance(nested, dict) else config
    return bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
