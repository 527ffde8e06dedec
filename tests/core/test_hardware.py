"""Hardware profile: parsing of recorded macOS output and the budget/bandwidth decisions."""

from pathlib import Path

import pytest

from macapp.core import hardware
from macapp.core.hardware import GiB, HardwareError, budget_by_rule, profile_from_facts, what_if_machine

RECORDED = Path(__file__).parent / "recorded"


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


def test_gpu_cores_from_ioreg_and_system_profiler():
    assert hardware.parse_gpu_cores(recorded("ioreg_agx_m4max.txt")) == 40
    assert hardware.parse_gpu_cores(recorded("system_profiler_displays_m3max30.txt")) == 30
    assert hardware.parse_gpu_cores("no such key") is None


def test_wired_limit_override_parsing():
    assert hardware.parse_wired_limit_mb(recorded("sysctl_wired_limit_default.txt")) is None
    assert hardware.parse_wired_limit_mb(recorded("sysctl_wired_limit_56g.txt")) == 56 * GiB
    assert hardware.parse_wired_limit_mb("garbage") is None


def test_detected_mac_prefers_metal_budget():
    brand = recorded("sysctl_brand_m4max.txt")
    memory = int(recorded("sysctl_memsize_64g.txt"))
    cores = hardware.parse_gpu_cores(recorded("ioreg_agx_m4max.txt"))
    profile = hardware.profile_from_facts(brand, memory, cores, mlx_budget=51_539_607_552, wired_limit=None)
    assert profile.chip == "Apple M4 Max"
    assert profile.memory_bytes == 64 * GiB
    assert profile.gpu_cores == 40
    assert profile.bandwidth_gbs == 546
    assert profile.budget_bytes == 51_539_607_552
    assert profile.budget_source == "mlx"
    assert profile.is_apple_silicon


def test_binned_chip_bandwidth_follows_gpu_cores():
    memory = 36 * GiB
    small = hardware.profile_from_facts("Apple M3 Max", memory, 30, None, None)
    big = hardware.profile_from_facts("Apple M3 Max", 48 * GiB, 40, None, None)
    assert small.bandwidth_gbs == 300 and big.bandwidth_gbs == 400
    # Unknown core count: the 36 GB M3 Max only ships with the 30-core GPU.
    assert hardware.what_if_machine("M3 Max", 36 * GiB).gpu_cores == 30
    assert hardware.what_if_machine("M4 Max", 128 * GiB).bandwidth_gbs == 546


def test_wired_limit_used_when_metal_cannot_say():
    profile = hardware.profile_from_facts("Apple M2 Ultra", 192 * GiB, 76, None, 180 * GiB)
    assert profile.budget_bytes == 180 * GiB and profile.budget_source == "wired-limit"


def test_budget_rule_matches_measured_defaults():
    # Measured: 16 GB M3 → 11.84 GB; 24 GB → 17.76 GiB; 128 GB → 107.5 GiB (apple-silicon.md).
    assert hardware.budget_by_rule(16 * GiB) == pytest.approx(11.84e9, rel=0.02)
    assert hardware.budget_by_rule(24 * GiB) == pytest.approx(17.76 * GiB, rel=0.01)
    assert hardware.budget_by_rule(128 * GiB) == pytest.approx(107.5 * GiB, rel=0.01)
    sizes = [8, 16, 24, 36, 48, 64, 96, 128, 192, 512]
    budgets = [hardware.budget_by_rule(s * GiB) for s in sizes]
    assert budgets == sorted(budgets) and all(b < s * GiB for b, s in zip(budgets, sizes))


def test_non_apple_machine_gets_rule_budget_and_no_bandwidth():
    profile = hardware.profile_from_facts("AMD EPYC 7B13", 24 * GiB, None, None, None)
    assert not profile.is_apple_silicon
    assert profile.bandwidth_gbs is None
    assert profile.budget_bytes == hardware.budget_by_rule(24 * GiB)
    assert profile.source == "not-apple"


@pytest.mark.parametrize(
    "text, expected",
    [("M3 Ultra", ("M3", "Ultra")), ("Apple M4 Pro", ("M4", "Pro")), ("m4max", ("M4", "Max")), ("M2", ("M2", "")), ("  apple   m5  ", ("M5", ""))],
)
def test_parse_chip(text, expected):
    assert hardware.parse_chip(text) == expected


@pytest.mark.parametrize("text", ["M9", "M4 Ultra", "Intel Core i9", "", "RTX 4090"])
def test_parse_chip_rejects_unknown(text):
    with pytest.raises(HardwareError):
        hardware.parse_chip(text)


@pytest.mark.parametrize("text, gib", [("512GB", 512), ("24 GiB", 24), ("16384MB", 16), ("64", 64), ("1TB", 1024), ("36g", 36)])
def test_parse_memory(text, gib):
    assert hardware.parse_memory(text) == gib * GiB


@pytest.mark.parametrize("text", ["12XB", "", "lots", "1GB", "-8GB", "9TB"])
def test_parse_memory_rejects_nonsense(text):
    with pytest.raises(HardwareError):
        hardware.parse_memory(text)


def test_what_if_rejects_silly_gpu_cores():
    with pytest.raises(HardwareError):
        hardware.what_if_machine("M4 Max", 64 * GiB, gpu_cores=1000)


def test_detect_this_machine_is_consistent():
    profile = hardware.detect_machine(use_mlx=False)
    assert profile.memory_bytes > 0
    assert 0 < profile.budget_bytes <= profile.memory_bytes


# --- GPU throughput and the wired limit ---


def test_gpu_throughput_table_scales_by_cores_generation_and_accelerators():
    from macapp.core.hardware import GPU_TFLOPS_PER_CORE, MATMUL_ACCELERATION, gpu_tflops

    assert gpu_tflops(what_if_machine("M4 Max", 64 * GiB, 40)) == pytest.approx(40 * GPU_TFLOPS_PER_CORE["M4"])
    assert gpu_tflops(what_if_machine("M4 Max", 36 * GiB)) == pytest.approx(32 * GPU_TFLOPS_PER_CORE["M4"])  # 36 GB: binned
    m5, m4 = gpu_tflops(what_if_machine("M5 Max", 128 * GiB, 40)), gpu_tflops(what_if_machine("M4 Max", 128 * GiB, 40))
    assert 1.0 < m5 / m4 < 1.2  # shader cores: llama.cpp's Metal-only pp512, 987 vs 886 tok/s
    assert 3.0 < m5 * MATMUL_ACCELERATION["M5"] / m4 < 4.2  # with the neural accelerators: 3,347 vs 886
    ultra = gpu_tflops(what_if_machine("M3 Ultra", 512 * GiB))
    assert ultra < 2 * gpu_tflops(what_if_machine("M3 Max", 128 * GiB))  # two dies do not scale perfectly
    assert gpu_tflops(profile_from_facts("AMD EPYC", 64 * GiB, None, None, None)) is None


def test_max_safe_wired_limit_leaves_macos_room():
    from macapp.core.hardware import max_safe_wired_limit

    assert max_safe_wired_limit(16 * GiB) == 12 * GiB  # 4 GB floor
    assert max_safe_wired_limit(128 * GiB) == 112 * GiB  # an eighth of the RAM
    assert max_safe_wired_limit(24 * GiB) > budget_by_rule(24 * GiB)


@pytest.mark.parametrize(
    "text, expected",
    [("28GB", 28 * GiB), ("28 GiB", 28 * GiB), ("28g", 28 * GiB), ("28672", 28 * GiB), ("28672 MB", 28 * GiB), ("20.5GB", int(20.5 * GiB))],
)
def test_parse_wired_limit(text, expected):
    from macapp.core.hardware import parse_wired_limit

    assert parse_wired_limit(text, 32 * GiB) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("lots", "cannot read --wired-limit"),
        ("-5GB", "cannot read --wired-limit"),
        ("0", "macOS's default"),
        ("0GB", "macOS's default"),
        ("100", "did you mean 100GB"),
        ("0.5GB", "below 1 GB"),
        ("40GB", "more than this Mac's 32 GB"),
        ("40000", "more than this Mac's 32 GB"),
    ],
)
def test_parse_wired_limit_refuses_bad_values_clearly(text, message):
    from macapp.core.hardware import parse_wired_limit

    with pytest.raises(HardwareError) as exc:
        parse_wired_limit(text, 32 * GiB)
    assert message in str(exc.value)


def test_with_wired_limit_moves_the_budget_only():
    from macapp.core.hardware import with_wired_limit

    machine = what_if_machine("M4 Pro", 24 * GiB)
    raised = with_wired_limit(machine, 20 * GiB)
    assert raised.budget_bytes == 20 * GiB and raised.budget_source == "wired-limit"
    assert (raised.chip, raised.memory_bytes, raised.bandwidth_gbs) == (machine.chip, machine.memory_bytes, machine.bandwidth_gbs)
    assert with_wired_limit(machine, 64 * GiB).budget_bytes == machine.memory_bytes


@pytest.mark.parametrize(
    "chip, gb, most",
    [("M4 Pro", 3 * 1024, 64), ("M4 Pro", 128, 64), ("M1", 32, 16), ("M3 Max", 192, 128), ("M2 Ultra", 256, 192), ("M5 Pro", 96, 64)],
)
def test_a_what_if_past_what_apple_sells_with_the_chip_is_warned_about_not_refused(chip, gb, most):
    machine = what_if_machine(chip, gb * GiB)  # still built: what-ifs stay possible
    warning = hardware.machine_warning(machine)
    assert warning is not None and f"{gb:,} GB" in warning and f"at most {most} GB" in warning and "does not exist" in warning


@pytest.mark.parametrize("chip, gb", [("M4 Pro", 64), ("M4 Pro", 24), ("M3 Ultra", 512), ("M2 Max", 96), ("M1", 8), ("M5 Max", 128)])
def test_macs_apple_sells_get_no_warning(chip, gb):
    assert hardware.machine_warning(what_if_machine(chip, gb * GiB)) is None


def test_every_chip_in_the_table_has_a_memory_ceiling():
    assert {(f, t) for f, tiers in hardware.BANDWIDTH_GBS.items() for t in tiers} == {(f, t) for f, tiers in hardware.MAX_MEMORY_GB.items() for t in tiers}
    assert hardware.machine_warning(profile_from_facts("AMD EPYC", 3 * 1024 * GiB, None, None, None)) is None
