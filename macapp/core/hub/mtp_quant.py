"""Quantizing an MTP head like its build, the way mlx-lm quantizes a model (`mlx_lm.utils.quantize_model`).

mlx-lm quantizes every module that has `to_quantized` (Linear, SwitchLinear, Embedding) whose weight's last
dimension divides by the group size; for MoE models its `quant_predicate` keeps the router gates (`mlp.gate`,
`shared_expert_gate`) at 8 bits, group 64. In an MTP head those modules are the `.weight` tensors of two or more
dimensions (fc, attention and MLP projections, experts); norms are 1-D and stay as they are. Before quantizing,
mlx-lm casts the weights to the model's dtype; so do we. A quantized `X.weight` becomes `X.weight` (packed uint32),
`X.scales` and `X.biases`, the names mlx-lm saves.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # naming MLX's types costs nothing at start-up
    import mlx.core as mx

DTYPE_BYTES = {
    "BF16": 2,
    "F16": 2,
    "F32": 4,
    "F64": 8,
    "I8": 1,
    "U8": 1,
    "I16": 2,
    "U16": 2,
    "I32": 4,
    "U32": 4,
    "I64": 8,
    "U64": 8,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
ROUTER_GATES = ("mlp.gate.weight", "shared_expert_gate.weight")


@dataclass(frozen=True)
class QuantRule:
    bits: int | None  # None: the build is not quantized (the head is only cast to its dtype)
    group_size: int = 64
    dtype: str = "BF16"  # safetensors name of the build's float dtype
    moe: bool = False

    def spec(self, name: str, shape: tuple[int, ...]) -> tuple[int, int] | None:
        """(bits, group size) mlx-lm would quantize this tensor with, or None when it stays as it is."""
        if self.bits is None or not name.endswith(".weight") or len(shape) < 2:
            return None
        bits, group = (8, 64) if self.moe and name.endswith(ROUTER_GATES) else (self.bits, self.group_size)
        return (bits, group) if shape[-1] % group == 0 else None

    def stored_bytes(self, name: str, shape: tuple[int, ...]) -> int:
        """Bytes the tensor takes once quantized (packed weight + scales + biases), or cast to the build's dtype."""
        count = prod(shape)
        spec = self.spec(name, shape)
        if spec is None:
            return count * DTYPE_BYTES[self.dtype]
        bits, group = spec
        return count * bits // 8 + 2 * (count // group) * DTYPE_BYTES[self.dtype]

    def quantize(self, tensors: dict[str, mx.array]) -> dict[str, mx.array]:
        """The head's tensors as the build would store them (mx arrays in, mx arrays out)."""
        import mlx.core as mx

        dtype = {"BF16": mx.bfloat16, "F16": mx.float16, "F32": mx.float32}[self.dtype]
        out: dict[str, mx.array] = {}
        for name, value in tensors.items():
            if mx.issubdtype(value.dtype, mx.floating):
                value = value.astype(dtype)
            spec = self.spec(name, tuple(value.shape))
            if spec is None:
                out[name] = value
                continue
            packed, scales, biases = mx.quantize(value, group_size=spec[1], bits=spec[0])
            stem = name[: -len(".weight")]
            out[name], out[f"{stem}.scales"], out[f"{stem}.biases"] = packed, scales, biases
        return out
