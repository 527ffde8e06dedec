"""How long reading a prompt takes: the prefill (prompt-processing) time model behind `ttft_estimate_s`.

Reading a prompt is compute-bound, not bandwidth-bound: mlx-lm pushes the prompt through the model in chunks of
`prefill_step_size` tokens (2048), so every weight is read once per chunk while the GPU does
2 × (active parameters) FLOPs per token, plus the full-attention layers' QKᵀ and AV products (which grow with the
position in the context) and the DeltaNet layers' recurrent scan. Per chunk:

    time = weights read once (bandwidth)
         + matmul FLOPs ÷ (GPU FLOPS × matmul efficiency at this chunk's rows per weight matrix)
         + attention FLOPs ÷ (GPU FLOPS × attention efficiency)
           [+ off the M5's fused kernel: the scores' memory traffic, 12 bytes per score, and the K/V re-read once
              per query block of the app's blocked attention]
         + DeltaNet scan FLOPs ÷ (GPU FLOPS × scan efficiency)
         + a fixed cost per layer (launches, norms, small ops; what dominates small builds)

M1/M2 GPUs emulate bfloat16, so every kernel's efficiency there is × `Calibration.no_bf16`. Short prompts are
dominated by the per-chunk costs, long ones by attention, whose cost per token grows with the context already read.

The constants (`FITTED`) are fitted to public Apple measurements listed with their URLs in
`bench/fit_accuracy.py` (`python bench/fit_accuracy.py --fit` refits them and prints the leave-one-out error by
chip and prompt length; docs/fit.md, "How the numbers are made"). `estimate.estimate` calls `estimate_prefill`, so there
is still one function producing the figure every screen shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from macapp.core.hardware import BANDWIDTH_EFFICIENCY, LAYER_COST_SCALE, MATMUL_ACCELERATION, MachineProfile, gpu_tflops

# M1 and M2 GPUs have no native bfloat16: Metal emulates it, and MLX's quantized matmuls and attention take the
# bf16 activations of every mlx-community Qwen build, so those two generations run every GPU kernel slower.
NO_BF16_FAMILIES = ("M1", "M2")
# MLX runs head-dim-256 attention through its fused kernel only on the M5's neural accelerators; everywhere else the
# unfused path materialises the scores: QKᵀ writes them (2 bytes, bf16), the causal mask add reads and writes them
# (4), softmax reads and writes them (4), AV reads them (2).
SCORE_PASS_BYTES = 12
SCORES_BLOCK_BYTES = 1 << 29  # long_context.SCORES_BLOCK_BYTES: the app reads a long chunk's queries in blocks
SCORE_BYTES = 2


@dataclass(frozen=True)
class Calibration:
    """The fitted constants (bench/fit_accuracy.py --fit refits them on the public runs listed there)."""

    # Matmul efficiency (share of the GPU's FLOPS reached) rises with the rows each weight matrix sees per chunk:
    # eff = MAX × rows / (rows + HALF). Dense projections see the whole chunk; a routed expert sees only
    # chunk × routed / experts rows (2048 × 8 / 256 = 64), through MLX's gather_qmm kernel.
    dense_eff: float
    dense_rows_half: float
    expert_eff: float
    expert_rows_half: float
    # The M5's GPU neural accelerators as MLX uses them: dense matmuls and (fused) attention, the expert kernel.
    accel_dense: float
    accel_expert: float
    attention_eff: float  # QKᵀ and AV FLOPs at head_dim 256, bf16, through the M5's fused kernel
    attention_eff_unfused: float  # the same FLOPs as two plain bf16 matmuls (every other GPU; scores in memory)
    no_bf16: float  # M1/M2: every kernel's efficiency × this (bf16 emulated)
    scan_eff: float  # the gated-delta Metal kernel steps through the chunk token by token (latency-bound)
    layer_chunk_ms: float  # fixed cost per layer per chunk on an M3-generation GPU (launches, norms, small ops)


# Fitted (least squares on log estimate/measured, each source weighted 1/√its runs) to the fitted runs in
# bench/fit_accuracy.py PREFILL; `python bench/fit_accuracy.py --fit` prints these and the leave-one-out table.
FITTED = Calibration(
    dense_eff=0.977,
    dense_rows_half=97.5,
    expert_eff=0.771,
    expert_rows_half=19.8,
    accel_dense=2.69,
    accel_expert=2.64,
    attention_eff=0.433,
    attention_eff_unfused=0.398,
    no_bf16=0.583,
    scan_eff=0.153,
    layer_chunk_ms=0.837,
)
DENSE_EFF, DENSE_ROWS_HALF = FITTED.dense_eff, FITTED.dense_rows_half
EXPERT_EFF, EXPERT_ROWS_HALF = FITTED.expert_eff, FITTED.expert_rows_half
ACCELERATED = {"dense": FITTED.accel_dense, "expert": FITTED.accel_expert}
ATTENTION_EFF = FITTED.attention_eff
SCAN_EFF = FITTED.scan_eff


@dataclass(frozen=True)
class Workload:
    """The work one prompt token costs a model, independent of the machine (built by estimate.prefill_workload)."""

    dense_flops: float  # per token: 2 × the projection parameters (attention, DeltaNet, shared expert, router)
    expert_flops: float  # per token: 2 × the routed experts' parameters (0 for a dense model)
    attention_flops: float  # per token per earlier position: 4 × query heads × head_dim × full-attention layers
    scan_flops: float  # per token: the DeltaNet recurrence over every linear layer's state
    weights_bytes: int  # read once per chunk (an MoE chunk touches every expert)
    expert_rows_share: float = 0.0  # routed experts / experts: the share of a chunk's rows each expert sees
    layers: int = 0  # every layer pays the fixed per-chunk cost
    heads: int = 0  # query heads of a full-attention layer (the scores' size)
    full_layers: int = 0  # full-attention layers
    kv_bytes_per_token: float = 0.0  # K and V of one position over every full-attention layer (re-read per query block)

    @property
    def matmul_flops(self) -> float:
        return self.dense_flops + self.expert_flops


def transformer_workload(
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int = 0,
    experts: int = 0,
    routed: int = 0,
    expert_intermediate: int = 0,
    bits_per_weight: float = 4.5,
) -> Workload:
    """A plain full-attention transformer (Qwen3), to check the model on mlx-lm's published Qwen3 benchmarks."""
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    if experts:
        dense, expert = attention + experts * hidden, 3 * routed * expert_intermediate * hidden
        stored = attention + 3 * experts * expert_intermediate * hidden
    else:
        dense, expert = attention + 3 * intermediate * hidden, 0
        stored = dense
    return Workload(
        dense_flops=2.0 * layers * dense,
        expert_flops=2.0 * layers * expert,
        attention_flops=4.0 * heads * head_dim * layers,
        scan_flops=0.0,
        weights_bytes=int(layers * stored * bits_per_weight / 8),
        expert_rows_share=routed / experts if experts else 0.0,
        layers=layers,
        heads=heads,
        full_layers=layers,
        kv_bytes_per_token=2.0 * kv_heads * head_dim * 2 * layers,
    )


@dataclass(frozen=True)
class PrefillEstimate:
    tokens: int
    seconds: float  # time to first token: every chunk plus the first generated token
    tps: float  # tokens / seconds, as mlx_lm.benchmark reports prompt_tps
    matmul_s: float
    attention_s: float  # QKᵀ/AV FLOPs plus, off the fused path, the scores' memory traffic and the K/V re-reads
    scan_s: float
    read_s: float  # every weight read once per chunk
    tflops: float  # the GPU throughput used
    fixed_s: float = 0.0  # the fixed per-layer cost of every chunk


def dense_efficiency(chunk: int, cal: Calibration = FITTED) -> float:
    return cal.dense_eff * chunk / (chunk + cal.dense_rows_half)


def expert_efficiency(work: Workload, chunk: int, cal: Calibration = FITTED) -> float:
    rows = max(1.0, chunk * work.expert_rows_share)
    return cal.expert_eff * rows / (rows + cal.expert_rows_half)


def accelerated(machine: MachineProfile, kind: str, cal: Calibration = FITTED) -> float:
    """The neural-accelerator gain MLX gets for this kind of work on this chip (1 where there are none)."""
    if machine.family not in MATMUL_ACCELERATION:
        return 1.0
    gain = {"dense": cal.accel_dense, "expert": cal.accel_expert}.get(kind, 1.0)
    return min(gain, MATMUL_ACCELERATION[machine.family])


def fused_attention(machine: MachineProfile) -> bool:
    """Whether MLX reads head-dim-256 attention through its fused kernel here (the M5's neural accelerators)."""
    return machine.family in MATMUL_ACCELERATION


def query_blocks(heads: int, queries: int, keys: int) -> int:
    """How many query blocks the app's blocked attention splits a chunk into (long_context.query_block)."""
    per_row = max(1, heads) * keys * SCORE_BYTES
    if queries * per_row <= SCORES_BLOCK_BYTES:
        return 1
    return math.ceil(queries / max(1, SCORES_BLOCK_BYTES // per_row))


def chunk_seconds(
    work: Workload, machine: MachineProfile, start: int, size: int, tflops: float, cal: Calibration = FITTED
) -> tuple[float, float, float, float, float]:
    """(matmul, attention, scan, weight-read, fixed) seconds for tokens [start, start + size) with `start` tokens
    already cached, on a GPU of `tflops` shader-core TFLOPS."""
    flops = tflops * 1e12
    bf16 = cal.no_bf16 if machine.family in NO_BF16_FAMILIES else 1.0
    bandwidth = (machine.bandwidth_gbs or 1.0) * 1e9 * BANDWIDTH_EFFICIENCY
    dense = flops * accelerated(machine, "dense", cal) * bf16
    matmul = work.dense_flops * size / (dense * dense_efficiency(size, cal))
    if work.expert_flops:
        experts = flops * accelerated(machine, "expert", cal) * bf16 * expert_efficiency(work, size, cal)
        matmul += work.expert_flops * size / experts
    positions = size * (start + (size + 1) / 2)  # each token attends to every earlier token and itself
    if fused_attention(machine):
        attention = work.attention_flops * positions / (dense * cal.attention_eff)
    else:
        attention = work.attention_flops * positions / (dense * cal.attention_eff_unfused)
        keys = start + size
        attention += work.heads * work.full_layers * positions * SCORE_PASS_BYTES / bandwidth
        blocks = query_blocks(work.heads, size, keys)
        attention += blocks * work.kv_bytes_per_token * keys / bandwidth
    scan = work.scan_flops * size / (flops * bf16 * cal.scan_eff)
    read = work.weights_bytes / bandwidth
    fixed = work.layers * cal.layer_chunk_ms * 1e-3 * LAYER_COST_SCALE.get(machine.family or "", 1.0)
    return matmul, attention, scan, read, fixed


def estimate_prefill(
    work: Workload,
    machine: MachineProfile,
    tokens: int,
    prefill_step: int,
    first_token_s: float = 0.0,
    cal: Calibration = FITTED,
) -> PrefillEstimate | None:
    """Time to read `tokens` into an empty cache in mlx-lm's chunks, plus the first token; None off Apple Silicon."""
    tflops = gpu_tflops(machine)
    if tflops is None or tokens <= 0:
        return None
    step = max(1, prefill_step)
    totals = [0.0] * 5
    start = 0
    while start < tokens:
        size = min(step, tokens - start)
        for i, part in enumerate(chunk_seconds(work, machine, start, size, tflops, cal)):
            totals[i] += part
        start += size
    seconds = sum(totals) + first_token_s
    return PrefillEstimate(
        tokens=tokens,
        seconds=seconds,
        tps=tokens / seconds,
        matmul_s=totals[0],
        attention_s=totals[1],
        scan_s=totals[2],
        read_s=totals[3],
        tflops=tflops,
        fixed_s=totals[4],
    )


def describe(p: PrefillEstimate, work: Workload, machine: MachineProfile, prefill_step: int) -> str:
    """The derivation line, like the decode one."""
    chunk = min(p.tokens, prefill_step)
    gain = accelerated(machine, "dense")
    notes = f" (GPU neural accelerators: dense matmuls and attention ×{gain:.1f})" if gain > 1 else ""
    if machine.family in NO_BF16_FAMILIES:
        notes += f" (no native bfloat16 on {machine.family}: every kernel ×{FITTED.no_bf16:.2f})"
    share = f"{dense_efficiency(chunk):.0%} of it"
    if work.expert_flops:
        share += f" (experts {expert_efficiency(work, chunk):.0%} of theirs, {chunk * work.expert_rows_share:.0f} rows each)"
    scores = "" if fused_attention(machine) else " (its scores held in memory)"
    return (
        f"reading a {p.tokens:,}-token prompt ≈ {format_duration(p.seconds)} (~{p.tps:,.0f} tok/s): "
        f"{work.matmul_flops / 1e9:.1f} GFLOP per token of matmuls{' (routed + shared experts)' if work.expert_flops else ''} "
        f"at {p.tflops:.1f} TFLOPS × {share} in {chunk:,}-token chunks "
        f"= {format_duration(p.matmul_s)}, full attention growing with the context{scores} {format_duration(p.attention_s)}, "
        f"DeltaNet scan {format_duration(p.scan_s)}, weights read once per chunk {format_duration(p.read_s)}, "
        f"fixed per-layer cost {format_duration(p.fixed_s)}{notes}. An estimate, not a measurement."
    )


def format_duration(seconds: float) -> str:
    """'0.4 s', '12 s', '3 min 20 s', '1 h 5 min' — how long a prompt takes to read."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs and minutes < 10 else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"
