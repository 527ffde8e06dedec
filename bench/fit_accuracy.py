"""How close the sizing model comes to published measurements (run by hand: `python bench/fit_accuracy.py`).

Prints estimate / measured for decode speed and for memory. The measured points are public runs (sources in README).
"""

from __future__ import annotations

import platform
import time

from macapp.core.catalog import resolve_model
from macapp.core.hardware import GiB, what_if_machine
from macapp.core.sizing import estimate

SPEED = [  # (model, bits, chip, RAM GiB, measured tok/s, source)
    ("Qwen3.5-35B-A3B", 8, "M3 Ultra", 512, 80.6, "seed article"),
    ("Qwen3.5-122B-A10B", 8, "M3 Ultra", 512, 42.5, "seed article"),
    ("Qwen3.5-27B", 8, "M3 Ultra", 512, 21.3, "seed article"),
    ("Qwen3.5-397B-A17B", 4, "M3 Ultra", 512, 39.0, "REAP card, unpruned baseline"),
    ("Qwen3.5-122B-A10B", 4, "M5 Max", 128, 62.0, "runyard.dev, 60.6 at 16K / 65 short"),
    ("Qwen3.5-4B", 4, "M4", 16, 39.0, "jitesh.dev Mac mini M4, mlx_lm"),
    ("Qwen3.5-0.8B", 4, "M4", 16, 192.0, "jitesh.dev Mac mini M4, mlx_lm"),
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
    for name, bits, context, measured, what in MEMORY:
        e = estimate(resolve_model(name, bits), max(context, 1), what_if_machine("M3 Ultra", 512 * GiB))
        ours = (e.weights_bytes if context == 0 else e.total_bytes) / 1e9
        print(f"{name:<20}{bits:>5}{ours:>10.1f} GB vs {measured:>6.1f} GB  ratio {ours / measured:.3f}  {what}")


if __name__ == "__main__":
    main()
