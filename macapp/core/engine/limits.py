"""What a turn may ask for: its settings are checked, and its prompt must fit the context and the memory budget.

Every check runs before any work, so a refused turn leaves the session as it was.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from macapp.core import events as ev
from macapp.core.engine.errors import EngineError
from macapp.core.engine.options import KVQuantization, MTPMode, SessionOptions
from macapp.core.fit import estimate
from macapp.core.sampling import SamplingParams, preset

if TYPE_CHECKING:
    from macapp.core.engine.model_folder import LoadedModel


def turn_sampling(sampling: SamplingParams | None, thinking: bool, budget: int | None, options: SessionOptions) -> SamplingParams:
    """The sampling a turn runs with (None: the model card's preset for the mode), its settings checked."""
    params = sampling if sampling is not None else preset(thinking)
    try:
        params.validate()
    except ValueError as exc:
        raise EngineError(f"Bad sampling setting: {exc}.", ev.ERROR) from exc
    if budget is not None and budget < 0:
        raise EngineError("The thinking budget must be 0 or more tokens.", ev.ERROR)
    if options.kv_bits not in (None, 4, 8):
        raise EngineError(f"kv_bits must be 4 or 8, not {options.kv_bits}.", ev.ERROR)
    return params


KV_GROUP_SIZES = (64, 32)  # mlx's quantize takes these (and 128); the first that divides the head dimension


def kv_quantization(m: "LoadedModel", options: SessionOptions) -> KVQuantization:
    """The session's KV quantization for `m`, with a group size that divides the model's head dimension: mlx quantizes
    the KV cache along it, and a head dimension of 32 with the default 64 failed every request. EngineError when no
    group size fits (the message says to run without KV quantization). A group size set on purpose (no front end
    does: SessionOptions.kv_group_size) is used as it is."""
    kv = options.kv
    head_dim = m.arch.head_dim if m.arch is not None else None
    chosen = kv.group_size != KV_GROUP_SIZES[0]
    if kv.bits is None or head_dim is None or head_dim % kv.group_size == 0 or chosen:
        return kv
    for group in KV_GROUP_SIZES:
        if head_dim % group == 0:
            return replace(kv, group_size=group)
    raise EngineError(
        f"A {kv.bits}-bit KV cache needs a head dimension that is a multiple of 32, and this model's is {head_dim}: "
        "run it without KV-cache quantization (no --kv-bits).",
        ev.ERROR,
    )


def context_limit(m: "LoadedModel", options: SessionOptions, prompt_len: int, cached: int, budget_bytes: int | None) -> int:
    """The session's context limit, once a prompt of `prompt_len` tokens after `cached` ones is known to fit it
    (with room for one reply token) and the memory budget; EngineError CONTEXT_LIMIT / MEMORY_BUDGET otherwise."""
    limit = min(options.context_limit or m.info.max_context, m.info.max_context)
    total = cached + prompt_len
    if total + 1 > limit:
        left = max(limit - cached, 0)
        raise EngineError(
            f"This message needs {prompt_len:,} tokens but only {left:,} of the {limit:,}-token context are left. "
            "Start a new conversation, shorten the message, or raise the context limit.",
            ev.CONTEXT_LIMIT,
        )
    if budget_bytes and m.arch is not None:
        need = memory_needed(m, options, prompt_len, total)
        if need > budget_bytes:
            raise EngineError(
                f"Reading this message would take about {need / 1e9:.1f} GB ({total:,} tokens of context), more than "
                f"the {budget_bytes / 1e9:.1f} GB budget for the model. Start a new conversation, turn on KV-cache "
                "quantization, or use a smaller model.",
                ev.MEMORY_BUDGET,
            )
    return limit


def memory_needed(m: "LoadedModel", options: SessionOptions, prompt_len: int, context: int) -> int:
    """Bytes the model needs to read a `prompt_len`-token prompt into a `context`-token cache (macapp.core.fit.estimate);
    only for a model whose config was sized (`m.arch`)."""
    arch = m.arch
    if arch is None:
        raise ValueError(f"{m.info.name}: its config could not be sized, so its memory cannot be estimated")
    drafts = m.mtp_head is not None and options.kv_bits is None and options.mtp is not MTPMode.OFF
    return (
        m.weights_bytes
        + estimate.kv_cache_bytes(arch, context, options.kv_bits)
        + (estimate.mtp_cache_bytes(arch, context, m.mtp_head.depth) if drafts and m.mtp_head is not None else 0)
        + estimate.state_bytes(arch)
        + estimate.prefill_bytes(arch, prompt_len, options.prefill_step_size)
        + estimate.runtime_bytes(m.weights_bytes)
    )
