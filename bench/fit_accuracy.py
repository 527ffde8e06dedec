"""How close the sizing model comes to published measurements (run by hand: `python bench/fit_accuracy.py`).

Prints estimate / measured for decode speed, prompt reading (prefill) and memory. The measured points are public runs
(sources in README and next to each row).
"""

from __future__ import annotations

import math
import platform
import sys
import time
from collections import Counter
from dataclasses import replace
from typing import NamedTuple

from macapp.core.fit import prefill_time
from macapp.core.catalog import resolve_model
from macapp.core.hardware import BANDWIDTH_EFFICIENCY, GiB, MachineProfile, what_if_machine
from macapp.core.fit.estimate import decode_tps, estimate, prefill_estimate, prefill_workload

SPEED = [  # (model, bits, chip, RAM GiB, measured tok/s, source)
    ("Qwen3.5-35B-A3B", 8, "M3 Ultra", 512, 80.6, "seed article"),
    ("Qwen3.5-122B-A10B", 8, "M3 Ultra", 512, 42.5, "seed article"),
    ("Qwen3.5-27B", 8, "M3 Ultra", 512, 21.3, "seed article"),
    ("Qwen3.5-397B-A17B", 4, "M3 Ultra", 512, 39.0, "REAP card, unpruned baseline"),
    ("Qwen3.5-122B-A10B", 4, "M5 Max", 128, 62.0, "runyard.dev, 60.6 at 16K / 65 short"),
    ("Qwen3.5-4B", 4, "M4", 16, 39.0, "jitesh.dev Mac mini M4, mlx_lm"),
    ("Qwen3.5-0.8B", 4, "M4", 16, 192.0, "jitesh.dev Mac mini M4, mlx_lm"),
]
QWEN3 = {  # full-attention Qwen3 models from their published configs (mlx-lm's own benchmarks use them)
    "Qwen3-8B": prefill_time.transformer_workload(4096, 36, 32, 8, 128, intermediate=12288),
    "Qwen3-4B": prefill_time.transformer_workload(2560, 36, 32, 8, 128, intermediate=9728),
    "Qwen3-0.6B": prefill_time.transformer_workload(1024, 28, 16, 8, 128, intermediate=3072),
    "Qwen3-30B-A3B": prefill_time.transformer_workload(2048, 48, 32, 4, 128, experts=128, routed=8, expert_intermediate=768),
}


class Run(NamedTuple):
    """A public prompt-reading measurement (and its decode figure where the same run reported one)."""

    model: str
    bits: int
    chip: str
    ram_gib: int
    gpu_cores: int
    tokens: int
    prompt_tps: float
    decode_tps: float | None
    source: str
    url: str
    fitted: bool = True  # False: another engine whose kernels differ from mlx-lm's (shown, not fitted to)


MLX_LM = "https://github.com/ml-explore/mlx-lm"
RAPID = "https://github.com/raullenchai/Rapid-MLX/blob/main/community-benchmarks/submissions/"
# Rapid-MLX's community benchmark (`rapid-mlx bench`, an mlx-lm server; prefix cache and speculation off, greedy,
# 5 rounds after a warm-up): prompt_tps = prompt tokens / server TTFT, the prompt being its fixed 512- and
# 2048-token corpus through the chat template (535 and 2,152 Qwen3.5 tokens, 531 and 2,159 Qwen3 tokens:
# TTFT × prefill_tps). The TTFT includes the HTTP round trip.
M4PRO_DOC = "https://github.com/raullenchai/Rapid-MLX/blob/main/docs/benchmarks/m4-pro-48gb-community.md"
MLX_SERVE_CSV = "https://github.com/ddalcu/mlx-serve/blob/main/docs/perf-csvs/mtp-ladder-26.7.12.csv"
PREFILL = [
    Run("Qwen3-4B", 4, "M4 Max", 64, 40, 2048, 1622.3, None, "mlx-lm BENCHMARKS.md, mlx_lm.benchmark", f"{MLX_LM}/blob/main/BENCHMARKS.md"),
    Run("Qwen3-30B-A3B", 4, "M4 Max", 64, 40, 2048, 1732.0, None, "mlx-lm PR #406", f"{MLX_LM}/pull/406"),
    Run("Qwen3-30B-A3B", 4, "M4 Max", 64, 40, 512, 1480.3, None, "mlx-lm PR #406", f"{MLX_LM}/pull/406"),
    Run("Qwen3-0.6B", 4, "M4 Max", 64, 40, 2048, 10278.8, None, "mlx-lm PR #406", f"{MLX_LM}/pull/406"),
    Run("Qwen3-0.6B", 4, "M4 Max", 64, 40, 512, 9520.4, None, "mlx-lm PR #406", f"{MLX_LM}/pull/406"),
    Run("Qwen3-4B", 4, "M3 Pro", 18, 18, 2048, 615.3, None, "mlx-lm PR #1569, mlx_lm.benchmark (cores assumed)", f"{MLX_LM}/pull/1569"),
    Run(
        "Qwen3.5-35B-A3B",
        4,
        "M4 Max",
        64,
        40,
        512,
        1518.2,
        101.6,
        "claude-code-local #31, mlx_lm.benchmark, Qwen3.6",
        "https://github.com/nicedreamzapp/claude-code-local/issues/31",
    ),
    Run(
        "Qwen3.5-35B-A3B",
        4,
        "M4 Max",
        64,
        40,
        1024,
        1777.4,
        101.4,
        "claude-code-local #31, mlx_lm.benchmark, Qwen3.6",
        "https://github.com/nicedreamzapp/claude-code-local/issues/31",
    ),
    *(
        Run("Qwen3.5-35B-A3B", 4, "M5 Max", 128, 40, tokens, tps, None, "mlx-lm #1480, Qwen3.6, mlx-lm 0.31.3", f"{MLX_LM}/issues/1480")
        for tokens, tps in ((8192, 3909.0), (32768, 3316.0), (65536, 2388.0), (100000, 1758.0), (130000, 1390.0))
    ),
    Run(
        "Qwen3.5-35B-A3B",
        4,
        "M5 Max",
        128,
        40,
        1479,
        2756.6,
        133.5,
        "Mac-MLX #24, mlx-swift-lm",
        "https://github.com/magicnight/Mac-MLX/issues/24",
        fitted=False,
    ),
    Run(
        "Qwen3.5-27B",
        4,
        "M5 Max",
        128,
        40,
        2349,
        598.0,
        28.6,
        "ollama #17884, Qwen3.6-27B nvfp4",
        "https://github.com/ollama/ollama/issues/17884",
        fitted=False,
    ),
    Run(
        "Qwen3.5-122B-A10B",
        4,
        "M2 Ultra",
        128,
        60,
        131072,
        131072 / 1158,
        None,
        "openclawradar Apr 2026, MLX 5-bit, 128K TTFT 19.3 min",
        "https://openclawradar.com/article/mlx-inference-performance-update-april-2026-benchmarks",
    ),
    Run(
        "Qwen3.5-27B",
        4,
        "M2 Max",
        32,
        30,
        2726,
        140.0,
        None,
        "Rapid-MLX #3157, Qwen3.8-27B, stock mlx-lm",
        "https://github.com/raullenchai/Rapid-MLX/issues/3157",
    ),
    Run("Qwen3.5-27B", 8, "M5 Max", 128, 40, 22400, 675.0, None, "splash #37, Qwen3.8-27B, MLX server", "https://github.com/incoai/splash/issues/37"),
    # --- added for issue #24: base/Pro chips, M2/M3 generations, small builds, long prompts off the M5 ---
    # Rapid-MLX community benchmark submissions (mlx 0.32.0 unless noted; GPU cores as the payload reports them)
    Run(
        "Qwen3.5-9B",
        4,
        "M2 Max",
        32,
        38,
        535,
        378.3,
        63.5,
        "Rapid-MLX bench, M2 Max 38-core",
        RAPID + "20260709-apple-m2-max-qwen3-5-9b-4bit-426cc891c0a3.json",
    ),
    Run(
        "Qwen3.5-9B",
        4,
        "M2 Max",
        32,
        38,
        2152,
        396.9,
        62.0,
        "Rapid-MLX bench, M2 Max 38-core",
        RAPID + "20260709-apple-m2-max-qwen3-5-9b-4bit-426cc891c0a3.json",
    ),
    Run(
        "Qwen3.5-35B-A3B",
        4,
        "M2 Max",
        32,
        38,
        535,
        619.0,
        84.2,
        "Rapid-MLX bench, M2 Max 38-core, Qwen3.6",
        RAPID + "20260709-apple-m2-max-qwen3-6-35b-4bit-96c1152b8cfe.json",
    ),
    Run(
        "Qwen3.5-35B-A3B",
        4,
        "M2 Max",
        32,
        38,
        2152,
        753.2,
        80.2,
        "Rapid-MLX bench, M2 Max 38-core, Qwen3.6",
        RAPID + "20260709-apple-m2-max-qwen3-6-35b-4bit-96c1152b8cfe.json",
    ),
    Run(
        "Qwen3.5-35B-A3B",
        4,
        "M2 Max",
        64,
        30,
        535,
        516.1,
        79.7,
        "Rapid-MLX bench, M2 Max 30-core, Qwen3.6",
        RAPID + "20260709-apple-m2-max-qwen3-6-35b-4bit-030c4de4afdb.json",
    ),
    Run(
        "Qwen3.5-35B-A3B",
        4,
        "M2 Max",
        64,
        30,
        2152,
        517.9,
        69.2,
        "Rapid-MLX bench, M2 Max 30-core, Qwen3.6",
        RAPID + "20260709-apple-m2-max-qwen3-6-35b-4bit-030c4de4afdb.json",
    ),
    Run(
        "Qwen3.5-4B", 4, "M5", 16, 8, 535, 931.5, 46.9, "Rapid-MLX bench, M5 MacBook Air 8-core", RAPID + "20260717-apple-m5-qwen3-5-4b-4bit-2635d2d546e9.json"
    ),
    Run(
        "Qwen3.5-4B",
        4,
        "M5",
        16,
        8,
        2152,
        1018.2,
        45.9,
        "Rapid-MLX bench, M5 MacBook Air 8-core",
        RAPID + "20260717-apple-m5-qwen3-5-4b-4bit-2635d2d546e9.json",
    ),
    Run(
        "Qwen3-0.6B",
        4,
        "M3 Ultra",
        256,
        60,
        531,
        8853.7,
        None,
        "Rapid-MLX bench, M3 Ultra 60-core, mlx 0.31.2",
        RAPID + "20260617-apple-m3-ultra-qwen3-0-6b-4bit-eb0f689d7b51.json",
    ),
    Run(
        "Qwen3-0.6B",
        4,
        "M3 Ultra",
        256,
        60,
        2159,
        9353.2,
        None,
        "Rapid-MLX bench, M3 Ultra 60-core, mlx 0.31.2",
        RAPID + "20260617-apple-m3-ultra-qwen3-0-6b-4bit-eb0f689d7b51.json",
    ),
    Run(
        "Qwen3-8B",
        4,
        "M3 Ultra",
        256,
        60,
        531,
        1069.2,
        None,
        "Rapid-MLX bench, M3 Ultra 60-core, mlx 0.31.2",
        RAPID + "20260617-apple-m3-ultra-qwen3-8b-4bit-e912922f4600.json",
    ),
    Run(
        "Qwen3-8B",
        4,
        "M3 Ultra",
        256,
        60,
        2159,
        1093.5,
        None,
        "Rapid-MLX bench, M3 Ultra 60-core, mlx 0.31.2",
        RAPID + "20260617-apple-m3-ultra-qwen3-8b-4bit-e912922f4600.json",
    ),
    # Rapid-MLX's M4 Pro 48 GB record (12 CPU / 16 GPU cores, mlx 0.32.2, mlx-lm 0.31.3): TTFT only, so prompt_tps =
    # the same 535 / 2,152 tokens ÷ TTFT (0.75/2.95 s, 1.37/5.59 s, 4.87/19.25 s); the 27B row is Qwen3.6-27B
    *(
        Run(model, 4, "M4 Pro", 48, 16, tokens, tokens / ttft, None, "Rapid-MLX M4 Pro 48 GB record (TTFT)", M4PRO_DOC)
        for model, short, long in (("Qwen3.5-4B", 0.75, 2.95), ("Qwen3.5-9B", 1.37, 5.59), ("Qwen3.5-27B", 4.87, 19.25))
        for tokens, ttft in ((535, short), (2152, long))
    ),
    # mlx-serve's published context ladder on an M4 Max (40-core assumed), Qwen3.6-27B-MTPLX-Optimized-Speed (4-bit,
    # group 32), cold prompts: the oMLX lane (an mlx-lm server) is fitted, mlx-serve's own engine is shown
    *(
        Run("Qwen3.5-27B", 4, "M4 Max", 64, 40, tokens, tps, None, "mlx-serve ladder, oMLX lane, Qwen3.6-27B", MLX_SERVE_CSV)
        for tokens, tps in ((512, 221.2), (1024, 238.9), (2048, 264.1), (4096, 268.2), (8192, 261.6), (16384, 252.7), (32768, 235.6), (65536, 207.9))
    ),
    *(
        Run("Qwen3.5-27B", 4, "M4 Max", 64, 40, tokens, tps, None, "mlx-serve ladder, mlx-serve engine", MLX_SERVE_CSV, fitted=False)
        for tokens, tps in ((512, 239.5), (2048, 269.4), (8192, 261.2), (32768, 239.4), (65536, 208.7))
    ),
    # mlx-serve #120: the same checkpoint on an M5 Max 128 GB, mlx-serve 26.8.1 (its own engine: shown)
    *(
        Run(
            "Qwen3.5-27B",
            4,
            "M5 Max",
            128,
            40,
            tokens,
            tps,
            None,
            "mlx-serve #120, mlx-serve engine",
            "https://github.com/ddalcu/mlx-serve/issues/120",
            fitted=False,
        )
        for tokens, tps in ((512, 669.6), (2048, 630.8), (8192, 627.0), (32768, 516.7))
    ),
    # mlx-lm #92: M3 Max, MLX 0.25.1 / mlx-lm 0.24 (April 2025, before lm_head-on-last-token and later MoE kernels),
    # a Qwen3 MoE read as Qwen3-30B-A3B 4-bit: shown for the M3 Max, not fitted
    Run("Qwen3-30B-A3B", 4, "M3 Max", 64, 40, 681, 1160.6, None, "mlx-lm #92, mlx-lm 0.24 (old)", f"{MLX_LM}/issues/92", fitted=False),
]
MEMORY = [  # (model, bits, context, measured GB, what was measured)
    ("Qwen3.5-35B-A3B", 8, 4096, 39.3, "seed: M3 Ultra while generating"),
    ("Qwen3.5-122B-A10B", 8, 4096, 133.6, "seed: M3 Ultra while generating"),
    ("Qwen3.5-27B", 8, 4096, 32.7, "seed: M3 Ultra while generating"),
    ("Qwen3.5-397B-A17B", 4, 0, 223.0, "mlx-community card: size on disk (weights only)"),
]


def main() -> None:
    print(f"fit accuracy — {platform.node()} {platform.machine()} — {time.strftime('%Y-%m-%d')}")
    print(f"{'model':<20}{'bits':>5}{'chip':>10}{'estimate':>10}{'measured':>10}{'ratio':>7}  source")
    ratios = []
    for name, bits, chip, ram, measured, source in SPEED:
        e = estimate(resolve_model(name, bits), 2048, what_if_machine(chip, ram * GiB))
        ratio = e.decode_tps_estimate / measured
        ratios.append(ratio)
        print(f"{name:<20}{bits:>5}{chip:>10}{e.decode_tps_estimate:>10.1f}{measured:>10.1f}{ratio:>7.2f}  {source}")
    print(f"speed: mean ratio {sum(ratios) / len(ratios):.2f}, worst {max(ratios, key=lambda r: abs(r - 1)):.2f}")
    print()
    print_prefill()
    print()
    for name, bits, context, measured, what in MEMORY:
        e = estimate(resolve_model(name, bits), max(context, 1), what_if_machine("M3 Ultra", 512 * GiB))
        ours = (e.weights_bytes if context == 0 else e.total_bytes) / 1e9
        print(f"{name:<20}{bits:>5}{ours:>10.1f} GB vs {measured:>6.1f} GB  ratio {ours / measured:.3f}  {what}")


def prefill_case(name: str, bits: int, machine: MachineProfile) -> tuple[prefill_time.Workload, float]:
    """The workload and first-token time behind one run's estimate."""
    if name in QWEN3:
        work = QWEN3[name]
        return work, work.weights_bytes / (machine.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY)
    model = resolve_model(name, bits)
    return prefill_workload(model), 1.0 / decode_tps(model, machine, 2048)


def prefill_tps(name: str, bits: int, machine: MachineProfile, tokens: int, cal: prefill_time.Calibration = prefill_time.FITTED) -> float:
    if name in QWEN3:
        work, first = prefill_case(name, bits, machine)
        return prefill_time.estimate_prefill(work, machine, tokens, 2048, first, cal).tps
    if cal is prefill_time.FITTED:
        return prefill_estimate(resolve_model(name, bits), machine, tokens).tps
    model = resolve_model(name, bits)
    first = 1.0 / decode_tps(model, machine, tokens)
    return prefill_time.estimate_prefill(prefill_workload(model), machine, tokens, 2048, first, cal).tps


# --- refitting the prompt-reading constants (python bench/fit_accuracy.py --fit) ---

FREE = (
    "dense_eff",
    "dense_rows_half",
    "expert_eff",
    "expert_rows_half",
    "accel_dense",
    "accel_expert",
    "attention_eff",
    "attention_eff_unfused",
    "no_bf16",
    "scan_eff",
    "layer_chunk_ms",
)
BOUNDS = {  # physically sensible ranges: an efficiency is at most 1, a gain at most the M5's ×3.4 (llama.cpp)
    "dense_eff": (0.2, 1.0),
    "dense_rows_half": (1.0, 2000.0),
    "expert_eff": (0.1, 1.0),
    "accel_dense": (1.0, 3.4),
    "accel_expert": (1.0, 3.4),
    "attention_eff": (0.05, 1.0),
    "attention_eff_unfused": (0.05, 1.0),
    "expert_rows_half": (0.1, 2000.0),
    "no_bf16": (0.2, 1.0),
    "scan_eff": (0.005, 1.0),
    "layer_chunk_ms": (0.0, 20.0),
}


def _cases(runs: list[Run]) -> list[tuple[Run, prefill_time.Workload, MachineProfile, float]]:
    cases = []
    for run in runs:
        machine = what_if_machine(run.chip, run.ram_gib * GiB, run.gpu_cores)
        model = None if run.model in QWEN3 else resolve_model(run.model, run.bits)
        work, _ = prefill_case(run.model, run.bits, machine)
        first = work.weights_bytes / (machine.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY) if model is None else (1.0 / decode_tps(model, machine, run.tokens))
        cases.append((run, work, machine, first))
    return cases


def _log_ratios(cases, cal: prefill_time.Calibration) -> list[float]:
    return [math.log(prefill_time.estimate_prefill(work, machine, run.tokens, 2048, first, cal).tps / run.prompt_tps) for run, work, machine, first in cases]


def fit(runs: list[Run], start: prefill_time.Calibration = prefill_time.FITTED) -> prefill_time.Calibration:
    """Least squares on log(estimate / measured); each source weighted 1/√(its runs) so a long ladder from one
    thread does not outweigh single runs from many."""
    from scipy.optimize import least_squares

    cases = _cases(runs)
    per_source = Counter(run.url for run in runs)
    weights = [1.0 / math.sqrt(per_source[run.url]) for run in runs]
    low = [math.log(max(BOUNDS[k][0], 1e-6)) for k in FREE]
    high = [math.log(BOUNDS[k][1]) for k in FREE]
    x0 = [min(max(math.log(max(getattr(start, k), 1e-6)), lo + 1e-9), hi - 1e-9) for k, lo, hi in zip(FREE, low, high)]

    def calibration(x) -> prefill_time.Calibration:
        return replace(start, **{k: math.exp(v) for k, v in zip(FREE, x)})

    def residuals(x):
        return [w * r for w, r in zip(weights, _log_ratios(cases, calibration(x)))]

    result = least_squares(residuals, x0, bounds=(low, high), x_scale=1.0, diff_step=1e-3)
    return calibration(result.x)


def leave_one_out(runs: list[Run], cal: prefill_time.Calibration) -> list[float]:
    """Estimate / measured for each run predicted by constants fitted without it."""
    out = []
    for i, run in enumerate(runs):
        held_out = fit(runs[:i] + runs[i + 1 :], cal)
        out.append(math.exp(_log_ratios(_cases([run]), held_out)[0]))
    return out


BANDS = ((0, 1024, "< 1k"), (1024, 4096, "1k-4k"), (4096, 16384, "4k-16k"), (16384, 65536, "16k-64k"), (65536, 10**9, "≥ 64k"))


def band(tokens: int) -> str:
    return next(name for low, high, name in BANDS if low <= tokens < high)


def _summary(label: str, ratios: list[float]) -> str:
    logs = [math.log(r) for r in ratios]
    rms = math.sqrt(sum(x * x for x in logs) / len(logs))
    return f"{label:<14}{len(ratios):>4}{math.exp(sum(logs) / len(logs)):>8.2f}{min(ratios):>7.2f}{max(ratios):>7.2f}{math.exp(rms) - 1:>9.0%}"


def print_fit(loo: bool = True) -> None:
    runs = [run for run in PREFILL if run.fitted]
    cal = fit(runs)
    print("refit constants (prefill_time.Calibration):")
    for name in FREE:
        print(f"  {name} = {getattr(cal, name):.4g}   (now {getattr(prefill_time.FITTED, name):.4g})")
    in_sample = [math.exp(r) for r in _log_ratios(_cases(runs), cal)]
    print(f"in-sample, {len(runs)} runs: {min(in_sample):.2f}-{max(in_sample):.2f}")
    if not loo:
        return
    held = leave_one_out(runs, cal)
    print()
    print("leave-one-out estimate/measured (each run predicted by constants fitted without it)")
    head = f"{'':<14}{'runs':>4}{'geomean':>8}{'min':>7}{'max':>7}{'rms err':>9}"
    for title, key in (("by chip", lambda r: r.chip), ("by family", lambda r: r.chip.split()[0]), ("by prompt length", lambda r: band(r.tokens))):
        print(f"{title}:\n{head}")
        groups: dict[str, list[float]] = {}
        for run, ratio in zip(runs, held):
            groups.setdefault(key(run), []).append(ratio)
        order = [name for _, _, name in BANDS] if key(runs[0]) in [n for _, _, n in BANDS] else sorted(groups)
        for name in order:
            if name in groups:
                print(_summary(name, groups[name]))
    print(_summary("all", held))
    print()
    print(f"{'run':<20}{'chip':>10}{'tokens':>8}{'in':>6}{'LOO':>6}  source")
    for run, ratio, inside in zip(runs, held, in_sample):
        print(f"{run.model:<20}{run.chip:>10}{run.tokens:>8}{inside:>6.2f}{ratio:>6.2f}  {run.source}")


def print_prefill() -> None:
    """Prompt reading, with decode next to it where the same run reported both."""
    print(f"{'prompt reading':<20}{'bits':>5}{'chip':>10}{'tokens':>8}{'estimate':>10}{'measured':>10}{'ratio':>7}{'decode ratio':>14}  source")
    ratios = []
    for run in PREFILL:
        machine = what_if_machine(run.chip, run.ram_gib * GiB, run.gpu_cores)
        ours = prefill_tps(run.model, run.bits, machine, run.tokens)
        if run.fitted:
            ratios.append(ours / run.prompt_tps)
        decode_ratio = "—"
        if run.decode_tps is not None:
            decode_ratio = f"{estimate(resolve_model(run.model, run.bits), 2048, machine).decode_tps_estimate / run.decode_tps:.2f}"
        source = run.source if run.fitted else f"{run.source} (not fitted)"
        print(
            f"{run.model:<20}{run.bits:>5}{run.chip:>10}{run.tokens:>8}{ours:>10.1f}{run.prompt_tps:>10.1f}"
            f"{ours / run.prompt_tps:>7.2f}{decode_ratio:>14}  {source}"
        )
    print(f"prompt reading, {len(ratios)} fitted runs: mean ratio {sum(ratios) / len(ratios):.2f}, worst {max(ratios, key=lambda r: abs(r - 1)):.2f}")


if __name__ == "__main__":
    if "--fit" in sys.argv:
        print(f"prompt-reading refit — {platform.node()} {platform.machine()} — {time.strftime('%Y-%m-%d')}")
        print_fit(loo="--no-loo" not in sys.argv)
    else:
        main()
