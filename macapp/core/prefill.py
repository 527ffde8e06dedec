"""How long reading a prompt takes: the prefill (prompt-processing) time model behind `ttft_estimate_s`.

Reading a prompt is compute-bound, not bandwidth-bound: mlx-lm pushes the prompt through the model in chunks of
`prefill_step_size` tokens (2048), so every weight is read once per chunk while the GPU does
2 × (active parameters) FLOPs per token, plus the full-attention layers' QKᵀ and AV products (which grow with the
position in the context) and the DeltaNet layers' recurrent scan. Per chunk:

    time = weights read once (bandwidth)
         + matmul FLOPs ÷ (GPU FLOPS × matmul efficiency at this chunk's rows per weight matrix)
         + attention FLOPs ÷ (GPU FLOPS × attention efficiency)
         + DeltaNet scan FLOPs ÷ (GPU FLOPS × scan efficiency)

Short prompts are dominated by the per-chunk costs (weight reads, the matmul efficiency of few rows), long ones by
attention, whose cost per token grows with the context already read.

The efficiencies are calibrated on public Apple measurements (mlx-lm's own `mlx_lm.benchmark` lines first; the
sources are in `bench/fit_accuracy.py` and README, "How the numbers are made"). `sizing.estimate` calls
`estimate_prefill`, so there is still one function producing the figure every screen shows.
"""

from __future__ import annotations

from dataclasses import dataclass

from macapp.core.hardware import BANDWIDTH_EFFICIENCY, MATMUL_ACCELERATION, MachineProfile, gpu_tflops

# Fitted (least squares on log estimate/measured) to the public runs listed in bench/fit_accuracy.py.
# Matmul efficiency (share of the GPU's FLOPS reached) rises with the rows each weight matrix sees per chunk:
# eff = MAX × rows / (rows + HALF), i.e. every matrix costs as if the chunk had HALF more rows: the fixed
# per-chunk cost that dominates short prompts. Dense projections see the whole chunk; a routed expert sees only
# chunk × routed / experts rows (2048 × 8 / 256 = 64), through MLX's gather_qmm kernel, whose efficiency the runs
# show lower but nearly flat in the rows (HALF ≈ 1).
DENSE_EFF, DENSE_ROWS_HALF = 0.92, 340.0
EXPERT_EFF, EXPERT_ROWS_HALF = 0.74, 1.0
# The M5's GPU neural accelerators: llama.cpp gets ×3.4 on dense matmuls (hardware.MATMUL_ACCELERATION); what MLX's
# kernels show in prompt reading was fitted on the M5 Max runs: dense matmuls and attention ×ACCELERATED["dense"],
# the expert kernel (gather_qmm) ×ACCELERATED["expert"], the DeltaNet scan nothing.
ACCELERATED = {"dense": 3.0, "expert": 2.5}
ATTENTION_EFF = 0.42  # causal attention at head_dim 256, bf16; fitted mainly on the M5 Max 8K-130K ladder
# M1 and M2 GPUs have no native bfloat16 (Metal emulates it), which the attention kernel's bf16 inputs pay for.
ATTENTION_EFF_NO_BF16 = {"M1": 0.19, "M2": 0.19}  # fitted on the one M2 Ultra 128K run
SCAN_EFF = 0.097  # the gated-delta Metal kernel steps through the chunk token by token (latency-bound)


@dataclass(frozen=True)
class Workload:
    """The work one prompt token costs a model, independent of the machine (built by sizing.prefill_workload)."""

    dense_flops: float  # per token: 2 × the projection parameters (attention, DeltaNet, shared expert, router)
    expert_flops: float  # per token: 2 × the routed experts' parameters (0 for a dense model)
    attention_flops: float  # per token per earlier position: 4 × query heads × head_dim × full-attention layers
    scan_flops: float  # per token: the DeltaNet recurrence over every linear layer's state
    weights_bytes: int  # read once per chunk (an MoE chunk touches every expert)
    expert_rows_share: float = 0.0  # routed experts / experts: the share of a chunk's rows each expert sees

    @property
    def matmul_flops(self) -> float:
        return self.dense_flops + self.expert_flops


def transformer_workload(
    hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int, intermediate: int = 0,
    experts: int = 0, routed: int = 0, expert_intermediate: int = 0, bits_per_weight: float = 4.5,
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
    )


@dataclass(frozen=True)
class PrefillEstimate:
    tokens: int
    seconds: float  # time to first token: every chunk plus the first generated token
    tps: float  # tokens / seconds, as mlx_lm.benchmark reports prompt_tps
    matmul_s: float
    attention_s: float
    scan_s: float
    read_s: float  # every weight read once per chunk
    tflops: float  # the GPU throughput used


def dense_efficiency(chunk: int) -> float:
    return DENSE_EFF * chunk / (chunk + DENSE_ROWS_HALF)


def expert_efficiency(work: Workload, chunk: int) -> float:
    rows = max(1.0, chunk * work.expert_rows_share)
    return EXPERT_EFF * rows / (rows + EXPERT_ROWS_HALF)


def accelerated(machine: MachineProfile, kind: str) -> float:
    """The neural-accelerator gain MLX gets for this kind of work on this chip (1 where there are none)."""
    if machine.family not in MATMUL_ACCELERATION:
        return 1.0
    return min(ACCELERATED.get(kind, 1.0), MATMUL_ACCELERATION[machine.family])


def chunk_seconds(work: Workload, machine: MachineProfile, start: int, size: int, tflops: float) -> tuple[float, float, float, float]:
    """(matmul, attention, scan, weight-read) seconds for tokens [start, start + size) with `start` tokens already
    cached, on a GPU of `tflops` shader-core TFLOPS."""
    flops = tflops * 1e12
    dense = flops * accelerated(machine, "dense")
    matmul = work.dense_flops * size / (dense * dense_efficiency(size))
    if work.expert_flops:
        matmul += work.expert_flops * size / (flops * accelerated(machine, "expert") * expert_efficiency(work, size))
    positions = size * (start + (size + 1) / 2)  # each token attends to every earlier token and itself
    attention = work.attention_flops * positions / (dense * ATTENTION_EFF_NO_BF16.get(machine.family or "", ATTENTION_EFF))
    scan = work.scan_flops * size / (flops * SCAN_EFF)
    read = work.weights_bytes / ((machine.bandwidth_gbs or 1.0) * 1e9 * BANDWIDTH_EFFICIENCY)
    return matmul, attention, scan, read


def estimate_prefill(
    work: Workload, machine: MachineProfile, tokens: int, prefill_step: int, first_token_s: float = 0.0
) -> PrefillEstimate | None:
    """Time to read `tokens` into an empty cache in mlx-lm's chunks, plus the first token; None off Apple Silicon."""
    tflops = gpu_tflops(machine)
    if tflops is None or tokens <= 0:
        return None
    step = max(1, prefill_step)
    totals = [0.0, 0.0, 0.0, 0.0]
    start = 0
    while start < tokens:
        size = min(step, tokens - start)
        for i, part in enumerate(chunk_seconds(work, machine, start, size, tflops)):
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
    )


def describe(p: PrefillEstimate, work: Workload, machine: MachineProfile, prefill_step: int) -> str:
    """The derivation line, like the decode one."""
    chunk = min(p.tokens, prefill_step)
    gain = accelerated(machine, "dense")
    accel = f" (GPU neural accelerators: dense matmuls and attention ×{gain:.1f})" if gain > 1 else ""
    share = f"{dense_efficiency(chunk):.0%} of it"
    if work.expert_flops:
        share += f" (experts {expert_efficiency(work, chunk):.0%} of theirs, {chunk * work.expert_rows_share:.0f} rows each)"
    return (
        f"reading a {p.tokens:,}-token prompt ≈ {format_duration(p.seconds)} (~{p.tps:,.0f} tok/s): "
        f"{work.matmul_flops / 1e9:.1f} GFLOP per token of matmuls{' (routed + shared experts)' if work.expert_flops else ''} "
        f"at {p.tflops:.1f} TFLOPS × {share} in {chunk:,}-token chunks "
        f"= {format_duration(p.matmul_s)}, full attention growing with the context {format_duration(p.attention_s)}, "
        f"DeltaNet scan {format_duration(p.scan_s)}, weights read once per chunk {format_duration(p.read_s)}"
        f"{accel}. An estimate, not a measurement."
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
