"""This machine's profile for the fit check: chip, RAM, GPU cores, GPU memory budget, memory bandwidth.

The macOS facts come from small readers (sysctl, ioreg, MLX) whose parsing is tested on recorded output;
`what_if_machine` builds the same profile for any chip and RAM size.
"""

from __future__ import annotations

import platform
import re
import subprocess
from dataclasses import dataclass, replace

GiB = 1024**3

# Memory bandwidth in GB/s by family and tier; binned tiers keyed by GPU core count.
BANDWIDTH_GBS: dict[str, dict[str, float | dict[int, float]]] = {
    "M1": {"": 68.25, "Pro": 200, "Max": 400, "Ultra": 800},
    "M2": {"": 100, "Pro": 200, "Max": 400, "Ultra": 800},
    "M3": {"": 100, "Pro": 150, "Max": {30: 300, 40: 400}, "Ultra": 819},
    "M4": {"": 120, "Pro": 273, "Max": {32: 410, 40: 546}},
    "M5": {"": 153, "Pro": 307, "Max": {32: 460, 40: 614}},
}

# Typical GPU core counts, used when the count is not known (the larger bin where a chip is binned).
DEFAULT_GPU_CORES = {
    "M1": {"": 8, "Pro": 16, "Max": 32, "Ultra": 64},
    "M2": {"": 10, "Pro": 19, "Max": 38, "Ultra": 76},
    "M3": {"": 10, "Pro": 18, "Max": 40, "Ultra": 80},
    "M4": {"": 10, "Pro": 20, "Max": 40},
    "M5": {"": 10, "Pro": 20, "Max": 40},
}

# GPU throughput for prompt reading (compute-bound), in dense FP16 TFLOPS per GPU core. The M4's is its peak:
# 128 ALUs × 2 FLOPs × ~1.64 GHz (spec databases, e.g. hmc-tech.com: 32-core M4 Max 13.74 TFLOPS at 1.678 GHz;
# Apple GPUs run FP16 at the FP32 rate). The other generations are scaled by what llama.cpp's Apple Silicon
# scoreboard measured per GPU core (discussion #4167, Llama-2 7B Q4_0 pp512; Ultra chips divided by
# ULTRA_SCALING): M1 Ultra 16.1, M2 Ultra 16.3, M3 Ultra 18.4, M4 Pro 22.0, M4 Max 22.2 and a Metal-only
# M5 Max 24.7 tok/s per core. Clock-based peaks (M1 0.33, M2/M3 0.36) agree within 10%.
GPU_TFLOPS_PER_CORE = {"M1": 0.340, "M2": 0.344, "M3": 0.388, "M4": 0.420, "M5": 0.469}
# M5 GPU cores carry neural accelerators (matrix units) that MLX ≥ 0.30 uses on macOS ≥ 26.2: llama.cpp measured
# 3,347 vs 987 tok/s pp512 on the same M5 Max with and without them (×3.4); Apple's MLX blog reports up to 4×
# faster time to first token than an M4. What MLX gets of it per kind of work is fitted in prefill.ACCELERATED.
MATMUL_ACCELERATION = {"M5": 3.4}
ULTRA_SCALING = 0.90  # two dies: M2 Ultra 76-core 16.3 tok/s per core vs the M2 Max 38-core's ~17.8 (llama.cpp #4167)
BANDWIDTH_EFFICIENCY = 0.82  # share of peak memory bandwidth MLX reaches streaming weights (fitted on decode runs)
# Fixed per-layer GPU costs (kernel launch, small ops) relative to an M3-generation GPU; fitted on decode runs.
LAYER_COST_SCALE = {"M1": 1.3, "M2": 1.15, "M3": 1.0, "M4": 0.8, "M5": 0.62}

# The most unified memory Apple sells with each chip, in GB (Apple's tech specs for the Macs that carry it; the M5 Pro
# and Max from Apple's March 2026 announcement). A what-if past it describes a Mac that does not exist.
MAX_MEMORY_GB = {
    "M1": {"": 16, "Pro": 32, "Max": 64, "Ultra": 128},
    "M2": {"": 24, "Pro": 32, "Max": 96, "Ultra": 192},
    "M3": {"": 24, "Pro": 36, "Max": 128, "Ultra": 512},
    "M4": {"": 32, "Pro": 64, "Max": 128},
    "M5": {"": 32, "Pro": 64, "Max": 128},
}

# Share of RAM macOS lets Metal wire by default (max_recommended_working_set_size / RAM), by RAM size.
# Measured: 16 GB M3 → 11.84 GB (0.69), 24 GB → 17.76 GiB (0.74), 128 GB M5 Max → 107.5 GiB (0.84).
# Used only where MLX cannot report the real figure (Linux, tests, "what if" profiles).
BUDGET_FRACTIONS = ((8, 0.66), (16, 0.69), (36, 0.74), (64, 0.76), (96, 0.80))
BUDGET_FRACTION_LARGE = 0.84

CHIP = re.compile(r"^(?:apple\s*)?(m[1-9])\s*(pro|max|ultra)?$", re.IGNORECASE)


class HardwareError(ValueError):
    """A chip or memory size the user typed that cannot be understood."""


@dataclass(frozen=True)
class MachineProfile:
    chip: str  # "Apple M4 Pro", or the CPU name off a Mac
    memory_bytes: int
    budget_bytes: int  # what the GPU may use: the fit check's budget
    gpu_cores: int | None = None
    bandwidth_gbs: float | None = None  # None off Apple Silicon: no speed estimate
    family: str | None = None  # "M4"
    tier: str = ""  # "", "Pro", "Max", "Ultra"
    source: str = "detected"  # "detected" | "what-if" | "not-apple"
    budget_source: str = "rule"  # "mlx" (reported by Metal) | "wired-limit" | "rule"

    @property
    def is_apple_silicon(self) -> bool:
        return self.family is not None


def parse_chip(text: str) -> tuple[str, str]:
    """'Apple M3 Ultra' / 'm4max' / 'M2' → ('M3', 'Ultra'); HardwareError if not an Apple Silicon chip we know."""
    match = CHIP.match(re.sub(r"\s+", " ", (text or "").strip()))
    if not match:
        raise HardwareError(f"unknown chip {text!r}: use a name like 'M4', 'M3 Pro', 'M4 Max' or 'M3 Ultra'")
    family, tier = match.group(1).upper(), (match.group(2) or "").capitalize()
    if family not in BANDWIDTH_GBS or tier not in BANDWIDTH_GBS[family]:
        known = ", ".join(f"{f} {t}".strip() for f, tiers in BANDWIDTH_GBS.items() for t in tiers)
        raise HardwareError(f"there is no {family} {tier} chip in the table ({known})".replace("  ", " "))
    return family, tier


def parse_memory(text: str) -> int:
    """'512GB', '24 GiB', '16384MB', '64' (GB) → bytes. Apple's 'GB' of RAM is GiB, so GB and GiB read the same."""
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*(t|tb|tib|g|gb|gib|m|mb|mib)?\s*$", str(text or ""), re.IGNORECASE)
    if not match:
        raise HardwareError(f"cannot read memory size {text!r}: write it like '24GB', '128 GB' or '512GB'")
    value, unit = float(match.group(1)), (match.group(2) or "gb").lower()
    scale = {"t": 1024**4, "g": GiB, "m": 1024**2}[unit[0]]
    size = int(value * scale)
    if size < 4 * GiB or size > 4 * 1024**4:
        raise HardwareError(f"memory size {text!r} is outside what a Mac has (4 GB to 4 TB)")
    return size


def bandwidth_for(family: str, tier: str, gpu_cores: int | None) -> float:
    entry = BANDWIDTH_GBS[family][tier]
    if isinstance(entry, dict):
        bins = sorted(entry)
        cores = gpu_cores or bins[-1]
        # The nearest bin at or below the core count (a 38-core part reads as the 32-core bin's bus).
        eligible = [b for b in bins if b <= cores] or bins[:1]
        return float(entry[eligible[-1]])
    return float(entry)


def gpu_tflops(machine: MachineProfile) -> float | None:
    """FP16 TFLOPS of the GPU's shader cores (the M5's neural accelerators come on top: MATMUL_ACCELERATION);
    None off Apple Silicon."""
    if not machine.family or not machine.gpu_cores:
        return None
    tflops = machine.gpu_cores * GPU_TFLOPS_PER_CORE[machine.family]
    return tflops * (ULTRA_SCALING if machine.tier == "Ultra" else 1.0)


def default_gpu_cores(family: str, tier: str, memory_bytes: int) -> int:
    # Binned Max chips: the smaller GPU ships only with the smallest RAM option.
    gib = round(memory_bytes / GiB)
    if (family, tier) == ("M3", "Max") and gib in (36, 96):
        return 30
    if (family, tier) in (("M4", "Max"), ("M5", "Max")) and gib == 36:
        return 32
    return DEFAULT_GPU_CORES[family][tier]


def budget_by_rule(memory_bytes: int) -> int:
    """The documented estimate of macOS's default GPU working-set limit for a RAM size."""
    gib = memory_bytes / GiB
    for limit, fraction in BUDGET_FRACTIONS:
        if gib <= limit:
            return int(memory_bytes * fraction)
    return int(memory_bytes * BUDGET_FRACTION_LARGE)


# What a raised iogpu.wired_limit_mb must leave for macOS and the apps: 4 GB or an eighth of the RAM, whichever
# is more (mlx-lm itself warns when a model wires more than 90% of the recommended size).
WIRED_RESERVE_MIN = 4 * GiB
WIRED_RESERVE_SHARE = 0.125


def max_safe_wired_limit(memory_bytes: int) -> int:
    """The most we ever suggest letting the GPU wire on a Mac with this much RAM."""
    return int(memory_bytes - max(WIRED_RESERVE_MIN, WIRED_RESERVE_SHARE * memory_bytes))


def parse_wired_limit(text: str, memory_bytes: int) -> int:
    """`--wired-limit` → bytes: '28GB' / '28 GiB' (GB of RAM are GiB), or a plain number of MB as sysctl takes it
    ('28672'). HardwareError for nonsense, 0 (that is macOS's default: leave the flag out) or more than the RAM."""
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*(g|gb|gib|m|mb|mib)?\s*$", str(text or ""), re.IGNORECASE)
    if not match:
        raise HardwareError(f"cannot read --wired-limit {text!r}: write it like 28GB, or in MB as sysctl takes it (28672)")
    value, unit = float(match.group(1)), (match.group(2) or "mb").lower()
    size = int(value * (GiB if unit.startswith("g") else 1024**2))
    if size <= 0:
        raise HardwareError("--wired-limit 0 means macOS's default GPU limit: leave the flag out to see that")
    if unit.startswith("m") and not match.group(2) and value < 1024:
        raise HardwareError(f"--wired-limit {text} MB is less than 1 GB: did you mean {text}GB?")
    if size < GiB:
        raise HardwareError(f"--wired-limit {text!r} is below 1 GB: no model fits in that")
    if size > memory_bytes:
        raise HardwareError(
            f"--wired-limit {text} is more than this Mac's {memory_bytes / GiB:.0f} GB of RAM "
            f"(the most worth trying is {max_safe_wired_limit(memory_bytes) // 1024**2} MB)"
        )
    return size


def with_wired_limit(machine: MachineProfile, limit_bytes: int) -> MachineProfile:
    """The same Mac with iogpu.wired_limit_mb raised (or lowered) to `limit_bytes`: the budget follows it."""
    return replace(machine, budget_bytes=min(int(limit_bytes), machine.memory_bytes), budget_source="wired-limit")


def what_if_machine(chip: str, memory_bytes: int, gpu_cores: int | None = None) -> MachineProfile:
    """A profile for any chip in the bandwidth table with any RAM size (for buyers, and for tests)."""
    family, tier = parse_chip(chip)
    if gpu_cores is not None and not 4 <= gpu_cores <= 256:
        raise HardwareError(f"--gpu-cores {gpu_cores} is not a GPU core count an Apple chip has")
    cores = gpu_cores or default_gpu_cores(family, tier, memory_bytes)
    return MachineProfile(
        chip=f"Apple {family} {tier}".strip(),
        memory_bytes=memory_bytes,
        budget_bytes=budget_by_rule(memory_bytes),
        gpu_cores=cores,
        bandwidth_gbs=bandwidth_for(family, tier, cores),
        family=family,
        tier=tier,
        source="what-if",
        budget_source="rule",
    )


def machine_warning(machine: MachineProfile) -> str | None:
    """A sentence when `machine` has more memory than Apple sells with its chip (a what-if that cannot be bought:
    its figures are still worked out, for what-ifs past today's Macs); None for a Mac that exists."""
    if machine.family is None:
        return None
    most = MAX_MEMORY_GB[machine.family][machine.tier]
    gb = machine.memory_bytes / GiB
    if gb <= most:
        return None
    return f"no Mac with an {machine.chip} has {gb:,.0f} GB of memory: it comes with at most {most} GB. These figures are for a Mac that does not exist."


# --- readers of macOS facts: parsing is pure and tested on recorded output; the calls stay thin ---


def parse_gpu_cores(ioreg_or_profiler: str) -> int | None:
    """GPU core count from `ioreg -rc AGXAccelerator` ("gpu-core-count" = 40) or system_profiler ("Total Number of Cores: 40")."""
    for pattern in (r'"gpu-core-count"\s*=\s*(\d+)', r"Total Number of Cores:\s*(\d+)"):
        match = re.search(pattern, ioreg_or_profiler or "")
        if match:
            return int(match.group(1))
    return None


def parse_wired_limit_mb(text: str) -> int | None:
    """`sysctl -n iogpu.wired_limit_mb` → bytes of a user override, or None when 0 / unset."""
    try:
        value = int((text or "").strip())
    except ValueError:
        return None
    return value * 1024**2 if value > 0 else None


def profile_from_facts(
    brand: str,
    memory_bytes: int,
    gpu_cores: int | None,
    mlx_budget: int | None,
    wired_limit: int | None,
) -> MachineProfile:
    """The decision: combine what the readers found into a profile (pure, tested on recorded inputs)."""
    try:
        family, tier = parse_chip(brand)
    except HardwareError:
        return MachineProfile(
            chip=brand or platform.processor() or "unknown CPU",
            memory_bytes=memory_bytes,
            budget_bytes=budget_by_rule(memory_bytes),
            source="not-apple",
            budget_source="rule",
        )
    cores = gpu_cores or default_gpu_cores(family, tier, memory_bytes)
    if mlx_budget:
        budget, budget_source = mlx_budget, "mlx"  # Metal's figure already follows iogpu.wired_limit_mb
    elif wired_limit:
        budget, budget_source = min(wired_limit, memory_bytes), "wired-limit"
    else:
        budget, budget_source = budget_by_rule(memory_bytes), "rule"
    return MachineProfile(
        chip=f"Apple {family} {tier}".strip(),
        memory_bytes=memory_bytes,
        budget_bytes=budget,
        gpu_cores=cores,
        bandwidth_gbs=bandwidth_for(family, tier, cores),
        family=family,
        tier=tier,
        source="detected",
        budget_source=budget_source,
    )


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _mlx_budget() -> int | None:
    try:
        import mlx.core as mx

        info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
        value = info.get("max_recommended_working_set_size")
        return int(value) if value else None
    except Exception:  # no Metal (Linux CPU build) or an old MLX
        return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def detect_machine(use_mlx: bool = True) -> MachineProfile:
    """This machine. On a Mac: sysctl, ioreg and MLX's Metal budget; elsewhere psutil and the budget rule."""
    import psutil

    memory = psutil.virtual_memory().total
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        brand = _run(["sysctl", "-n", "machdep.cpu.brand_string"]).strip()
        memsize = _run(["sysctl", "-n", "hw.memsize"]).strip()
        memory = int(memsize) if memsize.isdigit() else memory
        cores = parse_gpu_cores(_run(["ioreg", "-rc", "AGXAccelerator"])) or parse_gpu_cores(_run(["system_profiler", "SPDisplaysDataType"]))
        wired = parse_wired_limit_mb(_run(["sysctl", "-n", "iogpu.wired_limit_mb"]))
        return profile_from_facts(brand, memory, cores, _mlx_budget() if use_mlx else None, wired)
    return profile_from_facts(_cpu_name(), memory, None, None, None)
