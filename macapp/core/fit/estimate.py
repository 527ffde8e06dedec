"""The sizing model: will a Qwen3.5 build fit this Mac at this context, and roughly how fast will it run.

`estimate()` is the one function whose number every screen shows (library badge, details bar, load
guardrail, `qwen-desk fit`). Memory = weights + KV cache (full-attention layers only) + DeltaNet state
(fixed) + overhead (one prefill chunk's activations + the runtime). Speed = a bandwidth model over the
bytes read per generated token, with a per-layer cost calibrated on measured Apple Silicon runs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

from macapp.core.fit import prefill_time
from macapp.core.catalog import Arch, ModelRef
from macapp.core.context_limit import check_context
from macapp.core.long_context import SCORE_BYTES, SCORES_BLOCK_BYTES, RopeInfo, factor_for, query_block
from macapp.core.hardware import BANDWIDTH_EFFICIENCY, LAYER_COST_SCALE, MachineProfile
from macapp.core.hub.mtp import MtpStatus, MtpWhere
from macapp.core.fit.picture_cost import VisionCost
from macapp.core.fit.weights import ACT_BYTES, STATE_BYTES, active_weights_bytes, layer_tensors, mlp_tensors, weights_of

KV_STEP = 256  # mlx-lm's KVCache grows in steps of 256 tokens
DEFAULT_CONTEXT = 32768  # the context a fit is judged at unless the user picks one (CLI, window, downloads)
DEFAULT_PREFILL_STEP = 2048  # mlx-lm's prefill_step_size
DEFAULT_KV_GROUP = 64

RUNTIME_FIXED_BYTES = int(0.4 * 1024**3)  # MLX, Metal and Python runtime
RUNTIME_WEIGHT_SHARE = 0.015  # allocator slack that grows with the model
FITS_SHARE = 0.90  # above 90% of the budget the verdict is "tight"

# Decode-speed model, calibrated on MLX measurements (see docs/fit.md, "How the numbers are made"):
# M3 Ultra 8-bit 35B-A3B 80.6 tok/s, 122B-A10B 42.5, 27B 21.3; M3 Ultra 4-bit 397B-A17B ~39;
# M5 Max 4-bit 122B-A10B 60-65; M4 4-bit 0.8B ~190.
LAYER_COST_MS = {"dense": 0.06, "moe": 0.19}  # fixed per-layer cost on an M3-generation GPU
EARLY_CONTEXT = 1024  # the "start of a conversation" context the headline speed is quoted at


@dataclass(frozen=True)
class Estimate:
    """Memory and speed for one model, quantization, context and machine."""

    model: str
    repo: str | None
    bits: int | None
    context: int
    kv_bits: int | None
    weights_bytes: int
    weights_exact: bool
    kv_cache_bytes: int
    kv_cache_all_layers_bytes: int  # what a KV cache on every layer would take (the naive formula)
    state_bytes: int
    prefill_bytes: int
    runtime_bytes: int
    overhead_bytes: int  # prefill + runtime
    total_bytes: int
    budget_bytes: int
    verdict: str  # "fits" | "tight" | "too_big"
    max_context: int
    decode_tps_estimate: float | None  # at the start of a conversation
    decode_tps_at_context: float | None  # with the whole chosen context filled
    prefill_tps_estimate: float | None  # average tok/s reading a `context`-token prompt into an empty cache
    ttft_estimate_s: float | None  # that prompt's time to first token
    machine: str
    derivation: list[str] = field(default_factory=list)
    # Images (macapp.core.vision): the tower's weights and one picture's activations at the processor's maximum.
    # `total_bytes` and the verdict count them only when `images` is on; text-only chats keep the number above.
    vision_bytes: int | None = None  # 0 for a text-only build, None when not known
    image_activation_bytes: int | None = None
    accepts_images: bool | None = None
    images: bool = False
    # How many agent sessions can run at once at `context` tokens each (the local API's batch): each keeps its own
    # KV cache and DeltaNet state beside the one copy of the weights. 0 when not even one fits.
    parallel_sessions: int = 0
    # Past the native length the model runs in long-context mode (YaRN ×2 or ×4, macapp.core.long_context).
    native_context: int = 0
    yarn_factor: int | None = None
    # The MTP head (macapp.core.hub.mtp): counted in `total_bytes` when it is on disk, so MTP would be used.
    mtp_where: str | None = None  # "in_build" | "fetched" | "to_fetch" | "none" | "unknown"; None: not asked
    mtp_bytes: int = 0  # the head in memory (quantized like the build; an estimate while it is still to fetch)
    mtp_counted: bool = False
    mtp_fetch_bytes: int = 0  # to download from `mtp_source_repo` (to_fetch)
    mtp_source_repo: str | None = None

    def to_json(self) -> dict[str, object]:
        return asdict(self)


# --- memory ---


def kv_bytes_per_token(arch: Arch, kv_bits: int | None = None, kv_group_size: int = DEFAULT_KV_GROUP, all_layers: bool = False) -> float:
    """K and V for one token across the full-attention layers (or every layer, for comparison)."""
    layers = arch.num_hidden_layers if all_layers else arch.full_attention_layers
    elements = 2 * layers * arch.num_key_value_heads * arch.head_dim
    if kv_bits is None:
        return float(elements * ACT_BYTES)
    return elements * (kv_bits / 8 + 2 * ACT_BYTES / kv_group_size)


def kv_cache_bytes(arch: Arch, tokens: int, kv_bits: int | None = None, all_layers: bool = False) -> int:
    """The KV cache for `tokens` of context, as mlx-lm allocates it (in 256-token steps)."""
    allocated = math.ceil(max(tokens, 0) / KV_STEP) * KV_STEP
    return int(allocated * kv_bytes_per_token(arch, kv_bits, all_layers=all_layers))


def mtp_cache_bytes(arch: Arch, tokens: int, head_layers: int = 1) -> int:
    """The MTP head's own KV cache over `tokens` of context (its layers are full-attention layers of the model's
    shape; never quantized: MTP does not run on a quantized cache)."""
    per_layer = kv_cache_bytes(arch, tokens) // max(arch.full_attention_layers, 1)
    return per_layer * head_layers


def state_bytes(arch: Arch) -> int:
    """The fixed DeltaNet state: a float32 recurrent state (value heads × 128 × 128) and a bf16 conv state per linear layer."""
    key_dim = arch.linear_num_key_heads * arch.linear_key_head_dim
    conv_dim = 2 * key_dim + arch.linear_num_value_heads * arch.linear_value_head_dim
    recurrent = arch.linear_num_value_heads * arch.linear_key_head_dim * arch.linear_value_head_dim * STATE_BYTES
    conv = (arch.linear_conv_kernel_dim - 1) * conv_dim * ACT_BYTES
    return arch.linear_layers * (recurrent + conv)


def prefill_bytes(arch: Arch, context: int, prefill_step: int = DEFAULT_PREFILL_STEP) -> int:
    """Activations alive while one prefill chunk goes through a layer (mlx-lm evaluates one chunk at a time)."""
    chunk = max(1, min(context, prefill_step))
    h = arch.hidden_size
    key_dim = arch.linear_num_key_heads * arch.linear_key_head_dim
    value_dim = arch.linear_num_value_heads * arch.linear_value_head_dim
    if arch.is_moe:
        ffn = arch.num_experts_per_tok * (3 * arch.moe_intermediate_size + h) + 3 * arch.shared_expert_intermediate_size
    else:
        ffn = 3 * arch.intermediate_size
    mixer = max(2 * (2 * key_dim + value_dim) + value_dim, 2 * arch.num_attention_heads * arch.head_dim * 2)
    per_token = ACT_BYTES * (4 * h + max(ffn, mixer))
    activations = chunk * per_token + arch.vocab_size * STATE_BYTES  # + the last position's float32 logits
    return activations + attention_scores_bytes(arch, context, prefill_step)


SCORE_COPIES = 1  # measured: MLX's unfused attention peaks at ~1.09 × the scores (the softmax reuses their buffer)


def attention_scores_bytes(arch: Arch, context: int, prefill_step: int = DEFAULT_PREFILL_STEP) -> int:
    """The attention scores of the last prefill chunk against the whole context: MLX materialises them for head
    dim 256 (its unfused path), in query blocks under SCORES_BLOCK_BYTES (macapp.core.long_context), plus the
    boolean causal mask of a block."""
    keys = max(1, context)
    chunk = max(1, min(context, prefill_step))
    block = query_block(arch.num_attention_heads, chunk, keys, SCORES_BLOCK_BYTES)
    return SCORE_COPIES * arch.num_attention_heads * block * keys * SCORE_BYTES + block * keys


def runtime_bytes(weights: int) -> int:
    return RUNTIME_FIXED_BYTES + int(RUNTIME_WEIGHT_SHARE * weights)


@dataclass(frozen=True)
class Memory:
    """What one machine holds (bytes): the one sum for the one-Mac fit, the sessions beside it and each host of
    several Macs (macapp.core.fit.cluster), whatever part of the weights, KV cache and state it keeps."""

    weights: int
    kv_cache: int
    state: int
    prefill: int  # one prefill chunk's activations
    runtime: int

    @property
    def overhead(self) -> int:
        return self.prefill + self.runtime

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.state + self.overhead


def memory(weights: int, kv_cache: int, state: int, prefill: int) -> Memory:
    """`weights` and what they bring: the runtime grows with them."""
    return Memory(weights, kv_cache, state, prefill, runtime_bytes(weights))


def verdict_for(total: int, budget: int) -> str:
    """The verdict for a total against one machine's budget: fits below 90% of it, tight up to it, too_big past it."""
    if total <= FITS_SHARE * budget:
        return "fits"
    return "tight" if total <= budget else "too_big"


# --- speed ---


def has_speed(machine: MachineProfile) -> bool:
    """Whether the speed model covers `machine` (Apple Silicon with a known memory bandwidth)."""
    return bool(machine.bandwidth_gbs and machine.family)


def decode_read_bytes(weights_read: float, state: float, kv_cache: float) -> float:
    """The bytes one generated token reads: the weights it uses, the DeltaNet state (read and written each step)
    and the KV cache (on one Mac, or one host's part of each)."""
    return weights_read + 2 * state + kv_cache


def decode_tps(model: ModelRef, machine: MachineProfile, context: int, kv_bits: int | None = None) -> float | None:
    """Estimated generation tok/s with `context` tokens already in the cache; None off Apple Silicon."""
    if not has_speed(machine):
        return None
    arch = model.arch
    bytes_per_token = decode_read_bytes(active_weights_bytes(arch, model.bits, model.group_size), state_bytes(arch), kv_cache_bytes(arch, context, kv_bits))
    return round(1000.0 / decode_step_ms(arch, machine, bytes_per_token, arch.num_hidden_layers), 1)


def decode_step_ms(arch: Arch, machine: MachineProfile, bytes_per_token: float, layers: int) -> float:
    """Milliseconds one machine spends on a generated token: streaming `bytes_per_token` from memory plus a
    fixed cost for each of the `layers` it runs (also used per host by macapp.core.fit.cluster). ValueError for a
    machine without a speed estimate (its callers ask first)."""
    if machine.bandwidth_gbs is None or machine.family is None:
        raise ValueError("this machine has no speed estimate (no known memory bandwidth)")
    stream_ms = bytes_per_token / (machine.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY) * 1e3
    return stream_ms + layers * LAYER_COST_MS["moe" if arch.is_moe else "dense"] * LAYER_COST_SCALE.get(machine.family, 1.0)


def _matmul_params(arch: Arch) -> tuple[int, int]:
    """(projection, routed-expert) parameters one prompt token multiplies; the output head is left out because
    mlx-lm computes logits for the last prompt position only."""
    shapes = layer_tensors(arch)
    dense = arch.linear_layers * sum(o * i for o, i in shapes["linear"])
    dense += arch.full_attention_layers * sum(o * i for o, i in shapes["full"])
    main, router = mlp_tensors(arch, active_only=True)
    if not arch.is_moe:
        return dense + arch.num_hidden_layers * sum(o * i for o, i in main), 0
    routed = 3 * arch.num_experts_per_tok * arch.moe_intermediate_size * arch.hidden_size
    per_layer = sum(o * i for o, i in main + router)
    return dense + arch.num_hidden_layers * (per_layer - routed), arch.num_hidden_layers * routed


def prefill_workload(model: ModelRef) -> prefill_time.Workload:
    """What one prompt token costs this model (for prefill.estimate_prefill)."""
    arch = model.arch
    state = arch.linear_num_value_heads * arch.linear_key_head_dim * arch.linear_value_head_dim
    dense, routed = _matmul_params(arch)
    return prefill_time.Workload(
        dense_flops=2.0 * dense,
        expert_flops=2.0 * routed,
        attention_flops=4.0 * arch.num_attention_heads * arch.head_dim * arch.full_attention_layers,
        # per state element: decay, k·S, the delta update and q·S (2 FLOPs each)
        scan_flops=8.0 * state * arch.linear_layers,
        weights_bytes=weights_of(model)[0],
        expert_rows_share=arch.num_experts_per_tok / arch.num_experts if arch.is_moe else 0.0,
        layers=arch.num_hidden_layers,
        heads=arch.num_attention_heads,
        full_layers=arch.full_attention_layers,
        kv_bytes_per_token=kv_bytes_per_token(arch),
    )


def prefill_estimate(
    model: ModelRef, machine: MachineProfile, tokens: int, kv_bits: int | None = None, prefill_step: int = DEFAULT_PREFILL_STEP
) -> prefill_time.PrefillEstimate | None:
    """Reading a `tokens`-token prompt into an empty cache, through to the first generated token; None off Apple Silicon."""
    first = decode_tps(model, machine, tokens, kv_bits)
    if first is None:
        return None
    return prefill_time.estimate_prefill(prefill_workload(model), machine, tokens, prefill_step, first_token_s=1.0 / first)


# --- the one number ---


def memory_at(arch: Arch, weights: int, context: int, kv_bits: int | None, prefill_step: int) -> Memory:
    """One Mac with one sequence of `context` tokens."""
    return memory(weights, kv_cache_bytes(arch, context, kv_bits), state_bytes(arch), prefill_bytes(arch, context, prefill_step))


def max_context(model: ModelRef, budget_bytes: int, kv_bits: int | None = None, prefill_step: int = DEFAULT_PREFILL_STEP) -> int:
    """The largest context (a multiple of 256, up to the model's maximum) whose total stays within the budget; 0 if none."""
    weights, _ = weights_of(model)
    return largest_context(lambda tokens: memory_at(model.arch, weights, tokens, kv_bits, prefill_step).total, budget_bytes, model.arch.max_position_embeddings)


def parallel_sequences(
    arch: Arch,
    weights: int,
    budget_bytes: int,
    context: int,
    kv_bits: int | None = None,
    prefill_step: int = DEFAULT_PREFILL_STEP,
    reserved: int = 0,
) -> int:
    """How many sequences (agent sessions) can be in flight together at `context` tokens each: beside the weights,
    the runtime, one prefill chunk and `reserved` bytes (the prompt checkpoints), each keeps its own KV cache
    (growing with the context) and its own fixed DeltaNet state. 0 when not even one fits."""
    one = memory_at(arch, weights, context, kv_bits, prefill_step)
    per_sequence = one.kv_cache + one.state
    room = budget_bytes - (one.total - per_sequence) - reserved
    return max(0, room // per_sequence) if per_sequence > 0 else 0


def largest_context(total_at: Callable[[int], int], budget_bytes: int, limit: int) -> int:
    """The largest context (a multiple of 256, up to `limit`) whose `total_at(tokens)` (growing with the tokens)
    stays within the budget; 0 if none. Shared by the one-Mac fit and the several-Macs fit (macapp.core.cluster)."""
    if total_at(KV_STEP) > budget_bytes:
        return 0
    lo, hi = 1, limit // KV_STEP  # in steps; total grows with the step count
    if total_at(hi * KV_STEP) <= budget_bytes:
        return limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if total_at(mid * KV_STEP) <= budget_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo * KV_STEP


def validate_context(model: ModelRef, context: int) -> None:
    """ContextError (a ValueError) for a context the model does not take: the rule chat and serve apply too."""
    arch = model.arch
    check_context(context, arch.max_position_embeddings, model.name, arch.native, arch.no_yarn_reason)


def estimate(
    model: ModelRef,
    context: int,
    machine: MachineProfile,
    kv_bits: int | None = None,
    prefill_step: int = DEFAULT_PREFILL_STEP,
    vision: VisionCost | None = None,
    accepts_images: bool | None = None,
    images: bool = False,
    mtp: MtpStatus | None = None,
) -> Estimate:
    """Memory, verdict, largest context and speed for `model` at `context` tokens on `machine`; with `images`, the
    total also holds `vision` (the tower and one picture at the processor's maximum) when the build accepts them."""
    validate_context(model, context)
    if kv_bits not in (None, 4, 8):
        raise ValueError(f"kv_bits must be 4 or 8 (or none for a bf16 cache), not {kv_bits}")
    arch = model.arch
    weights, exact = weights_of(model)
    held = memory_at(arch, weights, context, kv_bits, prefill_step)
    kv, state, prefill, runtime = held.kv_cache, held.state, held.prefill, held.runtime
    kv_all = kv_cache_bytes(arch, context, kv_bits, all_layers=True)
    with_images = bool(images and accepts_images is not False and vision is not None)
    extra = vision.total_bytes if with_images and vision is not None else 0
    head = mtp.head_bytes if mtp is not None and mtp.usable else 0
    extra += head
    total = held.total + extra
    early = decode_tps(model, machine, min(context, EARLY_CONTEXT), kv_bits)
    late = decode_tps(model, machine, context, kv_bits)
    reading = prefill_estimate(model, machine, context, kv_bits, prefill_step)
    gb = 1e9
    derivation = [
        f"weights {weights / gb:.2f} GB ({'exact file sizes' if exact else f'computed: {model.bits or 16}-bit, +0.5 bit/weight for MLX group-{model.group_size} scales and biases, router gates 8-bit, norms bf16'})",
        f"KV cache {kv / gb:.2f} GB: {arch.full_attention_layers} of {arch.num_hidden_layers} layers × {arch.num_key_value_heads} KV heads × {arch.head_dim} × 2 (K,V) × "
        f"{'bf16' if kv_bits is None else f'{kv_bits}-bit'} × {context:,} tokens ({kv_all / gb:.2f} GB if every layer cached)",
        f"DeltaNet state {state / 1e6:.0f} MB: {arch.linear_layers} linear layers × {arch.linear_num_value_heads} heads × 128 × 128 float32, fixed at any context",
        f"overhead {(prefill + runtime) / gb:.2f} GB: one {min(context, prefill_step):,}-token prefill chunk ({prefill / gb:.2f} GB, "
        f"of which {attention_scores_bytes(arch, context, prefill_step) / gb:.2f} GB attention scores against {context:,} tokens) + runtime ({runtime / gb:.2f} GB)",
        f"budget {machine.budget_bytes / gb:.2f} GB: {_budget_words(machine)}",
    ]
    if early is not None:
        derivation.append(
            f"speed ≈ {early:.0f} tok/s: {active_weights_bytes(arch, model.bits, model.group_size) / gb:.2f} GB read per token "
            f"at {machine.bandwidth_gbs:.0f} GB/s × {BANDWIDTH_EFFICIENCY:.0%} efficiency, plus a fixed per-layer cost "
            f"({'MoE routing' if arch.is_moe else 'dense'}); {late:.0f} tok/s with the whole context filled. An estimate, not a measurement."
        )
    if vision is not None and accepts_images is not False and vision.vision_bytes:
        derivation.append(
            f"images {'counted' if with_images else 'not counted (text-only chat)'}: vision tower {vision.vision_bytes / gb:.2f} GB "
            f"({'exact, from the safetensors headers' if vision.exact else 'computed from vision_config'}) + one picture at the processor's "
            f"maximum ({vision.max_image_tokens:,} image tokens) {vision.image_activation_bytes / gb:.2f} GB while it is encoded"
        )
    elif accepts_images is False:
        derivation.append("images: this build is text-only (no vision tower in its files)")
    elif images:
        derivation.append("images not counted: the vision tower's size is not known until its files are read (qwen-desk models --refresh)")
    if mtp is not None:
        derivation.append(mtp_words(mtp))
    if reading is not None:
        derivation.append(prefill_time.describe(reading, prefill_workload(model), machine, prefill_step))
    return Estimate(
        model=model.name,
        repo=model.repo,
        bits=model.bits,
        context=context,
        kv_bits=kv_bits,
        weights_bytes=weights,
        weights_exact=exact,
        kv_cache_bytes=kv,
        kv_cache_all_layers_bytes=kv_all,
        state_bytes=state,
        prefill_bytes=prefill,
        runtime_bytes=runtime,
        overhead_bytes=held.overhead,
        total_bytes=total,
        budget_bytes=machine.budget_bytes,
        verdict=verdict_for(total, machine.budget_bytes),
        max_context=max_context(model, machine.budget_bytes - extra, kv_bits, prefill_step),
        decode_tps_estimate=early,
        decode_tps_at_context=late,
        prefill_tps_estimate=None if reading is None else round(reading.tps, 1),
        ttft_estimate_s=None if reading is None else round(reading.seconds, 2),
        machine=machine.chip,
        derivation=derivation,
        vision_bytes=0 if accepts_images is False else (vision.vision_bytes if vision else None),
        image_activation_bytes=0 if accepts_images is False else (vision.image_activation_bytes if vision else None),
        accepts_images=accepts_images,
        images=with_images,
        parallel_sessions=parallel_sequences(model.arch, weights, machine.budget_bytes - extra, context, kv_bits, prefill_step),
        native_context=arch.native,
        yarn_factor=yarn_factor(arch, context),
        mtp_where=None if mtp is None else str(mtp.where),
        mtp_bytes=0 if mtp is None else mtp.head_bytes,
        mtp_counted=bool(head),
        mtp_fetch_bytes=0 if mtp is None else mtp.fetch_bytes,
        mtp_source_repo=None if mtp is None else mtp.source_repo,
    )


def mtp_words(mtp: MtpStatus) -> str:
    """Where the MTP head's bytes come from, for the derivation and `qwen-desk fit`."""
    mb = 1e6
    match mtp.where:
        case MtpWhere.IN_BUILD | MtpWhere.FETCHED:
            where = "in the build" if mtp.where is MtpWhere.IN_BUILD else "fetched already"
            return f"MTP head {mtp.head_bytes / mb:.0f} MB ({where}), counted: speculative decoding would use it"
        case MtpWhere.TO_FETCH:
            return (
                f"MTP head: {mtp.fetch_bytes / mb:.0f} MB to fetch from {mtp.source_repo} (`qwen-desk download <build> --mtp`), "
                f"about {mtp.head_bytes / mb:.0f} MB in memory once fetched; not counted until then"
            )
        case MtpWhere.NONE:
            return f"MTP head: none ({mtp.note})"
    return f"MTP head: {mtp.note or 'not known'}"


def yarn_factor(arch: Arch, context: int) -> int | None:
    """The YaRN factor a model runs at for `context` tokens (None at or below its native length)."""
    return factor_for(RopeInfo(native=arch.native, configured_factor=None, no_yarn_reason=arch.no_yarn_reason), context)


def _budget_words(machine: MachineProfile) -> str:
    ram = f"{machine.memory_bytes / 1024**3:.0f} GB RAM"
    return {
        "mlx": f"the GPU working-set limit Metal reports on this Mac ({ram})",
        "wired-limit": f"the iogpu.wired_limit_mb override ({ram})",
    }.get(machine.budget_source, f"macOS's default GPU share of {ram} (estimated: {machine.budget_bytes / machine.memory_bytes:.0%})")
