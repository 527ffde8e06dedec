"""Which split several Macs run a model with: the one rule (`choose_split`) the fit, the launcher and the CLI share.

- tensor (`model.shard`): every layer cut N ways; possible only where mlx-lm's Qwen3.5 `shard()` can cut the head
  counts, widths and quantization groups N ways (`tensor_split_problems`); the default wherever it is possible.
- pipeline (`model.model.pipeline`): a contiguous block of layers per host; possible with at least one layer
  per host (the one layer-count check).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from macapp.core.catalog import Arch


class Shard(str, enum.Enum):
    TENSOR = "tensor"
    PIPELINE = "pipeline"


class SplitRefused(ValueError):
    """Neither the split asked for nor (where falling back is allowed) the other one can run this model."""


@dataclass(frozen=True)
class Split:
    """The split chosen for a model on `hosts` Macs, and why."""

    shard: Shard
    hosts: int
    asked: Shard | None  # what the user asked for (None: the default)
    tensor_problems: tuple[str, ...]  # why tensor parallelism cannot cut the model `hosts` ways (empty: it can)
    why: str  # one line: why this split

    @property
    def fell_back(self) -> bool:
        """Tensor was asked for, is impossible, and the pipeline is used instead."""
        return self.asked is Shard.TENSOR and self.shard is Shard.PIPELINE


def tensor_split_problems(arch: Arch, hosts: int, bits: int | None = None, group_size: int = 64) -> list[str]:
    """Why mlx-lm's Qwen3.5 `shard()` cannot cut this model `hosts` ways (empty list: it can)."""
    n = hosts
    problems = []

    def need(count: int, what: str) -> None:
        if count % n:
            problems.append(f"{what} ({count}) do not divide by {n}")

    need(arch.num_attention_heads, "attention heads")
    kv = arch.num_key_value_heads
    if n <= kv:
        need(kv, "KV heads")
    elif n % kv:
        problems.append(f"{n} hosts is not a multiple of the {kv} KV heads (they are repeated when fewer than the hosts)")
    need(arch.linear_num_key_heads, "DeltaNet key heads")
    need(arch.linear_num_value_heads, "DeltaNet value heads")
    if not arch.tie_word_embeddings:
        need(arch.vocab_size, "vocabulary rows of the output head")
    if arch.is_moe:
        need(arch.moe_intermediate_size, "expert MLP widths")
        if arch.shared_expert_intermediate_size:
            need(arch.shared_expert_intermediate_size, "shared-expert MLP widths")
    else:
        need(arch.intermediate_size, "MLP widths")
    if bits is not None and not problems:
        # Layers cut along their input ("sharded-to-all") keep whole quantization groups only if each part does.
        inputs = {
            "DeltaNet out_proj": arch.linear_num_value_heads * arch.linear_value_head_dim,
            "attention o_proj": arch.num_attention_heads * arch.head_dim,
        }
        if arch.is_moe:
            inputs["expert down_proj"] = arch.moe_intermediate_size
            if arch.shared_expert_intermediate_size:
                inputs["shared-expert down_proj"] = arch.shared_expert_intermediate_size
        else:
            inputs["MLP down_proj"] = arch.intermediate_size
        for what, width in inputs.items():
            if (width // n) % group_size:
                problems.append(f"{what}'s input ({width}) cut {n} ways is not a whole number of {group_size}-weight quantization groups")
    return problems


def choose_split(
    arch: Arch,
    hosts: int,
    bits: int | None = None,
    group_size: int = 64,
    asked: Shard | None = None,
    fall_back: bool = False,
    name: str = "the model",
) -> Split:
    """The split for `arch` on `hosts` Macs: `asked`, else tensor where it is possible, else the pipeline.

    Tensor asked for but impossible: SplitRefused naming the problems, or with `fall_back` (the fit, which sizes
    what would run) the pipeline, the problems reported. A pipeline needs a layer per host: SplitRefused otherwise.
    One host splits nothing (no tensor problems)."""
    problems = tuple(tensor_split_problems(arch, hosts, bits, group_size)) if hosts > 1 else ()
    if asked is Shard.TENSOR and problems and not fall_back:
        raise SplitRefused(f"tensor parallelism cannot split this model {hosts} ways ({'; '.join(problems)}): use --shard pipeline")
    shard = Shard.PIPELINE if problems else (asked or Shard.TENSOR)
    if shard is Shard.PIPELINE and hosts > arch.num_hidden_layers:
        raise SplitRefused(f"{name} has {arch.num_hidden_layers} layers: a pipeline cannot have {hosts} stages")
    if asked is shard:
        why = f"{shard.value} split, as asked"
    elif problems:
        why = f"pipeline split: tensor parallelism is not possible ({'; '.join(problems)})"
    else:
        why = f"tensor split: the heads and widths divide by {hosts}"
    return Split(shard, hosts, asked, problems, why)


def default_shard(arch: Arch, hosts: int, bits: int | None = None, group_size: int = 64) -> Shard:
    """Tensor parallelism where the head counts allow it, else the pipeline split (choose_split's default)."""
    return choose_split(arch, hosts, bits, group_size, name="the model").shard
