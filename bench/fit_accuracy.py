"""How close the sizing model comes to published measurements (run by hand: `python bench/fit_accuracy.py`).

Prints estimate / measured for decode speed, prompt reading (prefill) and memory. The measured points are public runs
(sources in README and next to each row).
"""

from __future__ import annotations

import platform
import time
from typing import NamedTuple

from macapp.core import prefill
from macapp.core.catalog import resolve_model
from macapp.core.hardware import BANDWIDTH_EFFICIENCY, GiB, MachineProfile, what_if_machine
from macapp.core.sizing import estimate, prefill_estimate

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
    "Qwen3-4B": prefill.transformer_workload(2560, 36, 32, 8, 128, intermediate=9728),
    "Qwen3-0.6B": prefill.transformer_workload(1024, 28, 16, 8, 128, intermediate=3072),
    "Qwen3-30B-A3B": prefill.transformer_workload(2048, 48, 32, 4, 128, experts=128, routed=8, expert_intermediate=768),
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
    fitted: bool = True  # False: another engine whose kernels differ from mlx-lm's (shown, not fitted to)


PREFILL = [
    Run("Qwen3-4B", 4, "M4 Max", 64, 40, 2048, 1622.3, None, "mlx-lm BENCHMARKS.md, mlx_lm.benchmark"),
    Run("Qwen3-30B-A3B", 4, "M4 Max", 64, 40, 2048, 1732.0, None, "mlx-lm PR #406"),
    Run("Qwen3-30B-A3B", 4, "M4 Max", 64, 40, 512, 1480.3, None, "mlx-lm PR #406"),
    Run("Qwen3-0.6B", 4, "M4 Max", 64, 40, 2048, 10278.8, None, "mlx-lm PR #406"),
    Run("Qwen3-0.6B", 4, "M4 Max", 64, 40, 512, 9520.4, None, "mlx-lm PR #406"),
    Run("Qwen3-4B", 4, "M3 Pro", 18, 18, 2048, 615.3, None, "mlx-lm PR #1569, mlx_lm.benchmark (cores assumed)"),
    Run("Qwen3.5-35B-A3B", 4, "M4 Max", 64, 40, 512, 1518.2, 101.6, "claude-code-local #31, mlx_lm.benchmark, Qwen3.6"),
    Run("Qwen3.5-35B-A3B", 4, "M4 Max", 64, 40, 1024, 1777.4, 101.4, "claude-code-local #31, mlx_lm.benchmark, Qwen3.6"),
    Run("Qwen3.5-35B-A3B", 4, "M5 Max", 128, 40, 8192, 3909.0, None, "mlx-lm #1480, Qwen3.6, mlx-lm 0.31.3"),
    Run("Qwen3.5-35B-A3B", 4, "M5 Max", 128, 40, 32768, 3316.0, None, "mlx-lm #1480, Qwen3.6, mlx-lm 0.31.3"),
    Run("Qwen3.5-35B-A3B", 4, "M5 Max", 128, 40, 65536, 2388.0, None, "mlx-lm #1480, Qwen3.6, mlx-lm 0.31.3"),
    Run("Qwen3.5-35B-A3B", 4, "M5 Max", 128, 40, 100000, 1758.0, None, "mlx-lm #1480, Qwen3.6, mlx-lm 0.31.3"),
    Run("Qwen3.5-35B-A3B", 4, "M5 Max", 128, 40, 130000, 1390.0, None, "mlx-lm #1480, Qwen3.6, mlx-lm 0.31.3"),
    Run("Qwen3.5-35B-A3B", 4, "M5 Max", 128, 40, 1479, 2756.6, 133.5, "Mac-MLX #24, mlx-swift-lm", fitted=False),
    Run("Qwen3.5-27B", 4, "M5 Max", 128, 40, 2349, 598.0, 28.6, "ollama #17884, Qwen3.6-27B nvfp4", fitted=False),
    Run("Qwen3.5-122B-A10B", 4, "M2 Ultra", 128, 60, 131072, 131072 / 1158, None, "openclawradar Apr 2026, MLX 5-bit, 128K TTFT 19.3 min"),
    Run("Qwen3.5-27B", 4, "M2 Max", 32, 30, 2726, 140.0, None, "Rapid-MLX #3157, Qwen3.8-27B, stock mlx-lm"),
    Run("Qwen3.5-27B", 8, "M5 Max", 128, 40, 22400, 675.0, None, "splash #37, Qwen3.8-27B, MLX server"),
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


def prefill_tps(name: str, bits: int, machine: MachineProfile, tokens: int) -> float:
    if name in QWEN3:
        work = QWEN3[name]
        first_token = work.weights_bytes / (machine.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY)
        return prefill.estimate_prefill(work, machine, tokens, 2048, first_token).tps
    return prefill_estimate(resolve_model(name, bits), machine, tokens).tps


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
    print(
        f"prompt reading, {len(ratios)} fitted runs: mean ratio {sum(ratios) / len(ratios):.2f}, "
        f"worst {max(ratios, key=lambda r: abs(r - 1)):.2f}"
    )


if __name__ == "__main__":
    main()
