"""Per-session settings: the context limit, KV-cache quantization, the prefill chunk, the memory budget and MTP."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypedDict

from macapp.core.fit.estimate import DEFAULT_PREFILL_STEP


class KVKwargs(TypedDict):
    """mlx-lm's keyword arguments for KV-cache quantization (stream_generate, maybe_quantize_kv_cache)."""

    kv_bits: int | None
    kv_group_size: int
    quantized_kv_start: int


@dataclass(frozen=True)
class KVQuantization:
    """mlx-lm's KV-cache quantization of the full-attention layers (bits None: off)."""

    bits: int | None = None  # 4 or 8
    group_size: int = 64
    start: int = 0  # quantize once the cache holds this many tokens

    def kwargs(self) -> KVKwargs:
        """The keyword arguments mlx-lm's stream_generate and maybe_quantize_kv_cache take."""
        return KVKwargs(kv_bits=self.bits, kv_group_size=self.group_size, quantized_kv_start=self.start)


class MTPMode(enum.Enum):
    """Speculative decoding with the model's own MTP head (macapp.core.engine.mtp_decode)."""

    AUTO = "auto"  # when the build has a head, and only while it pays (measured; off for the conversation if not)
    ON = "on"  # whenever the build has a head (the draft depth still follows the measured acceptance)
    OFF = "off"


@dataclass(frozen=True)
class SessionOptions:
    context_limit: int | None = None  # tokens; None: the model's max_position_embeddings
    kv_bits: int | None = None  # 4 or 8 quantizes the full-attention layers' KV cache
    kv_group_size: int = 64
    quantized_kv_start: int = 0  # with kv_bits, quantize from this many cached tokens on
    prefill_step_size: int = DEFAULT_PREFILL_STEP
    memory_budget_bytes: int | None = None  # None: this machine's GPU budget (macapp.core.hardware)
    mtp: MTPMode = MTPMode.AUTO  # the MTP head: off, on, or auto (where it pays)

    @property
    def kv(self) -> KVQuantization:
        return KVQuantization(self.kv_bits, self.kv_group_size, self.quantized_kv_start)
