"""The sizing model against mlx-lm's real model classes and the published figures."""

import dataclasses

import pytest

from macapp.core.fit import estimate, weights
from macapp.core.catalog import resolve_model
from macapp.core.hardware import GiB, what_if_machine

M3_ULTRA = what_if_machine("M3 Ultra", 512 * GiB)


def test_published_mlx_sizes():
    # mlx-community/Qwen3.5-397B-A17B-4bit model card: text-only, ~223 GB on disk, router gates 8-bit.
    assert weights.computed_weights_bytes(resolve_model("Qwen3.5-397B-A17B", 4).arch, 4) / 1e9 == pytest.approx(223, rel=0.01)
    # Seeds, MLX 8-bit on an M3 Ultra while generating: 35B-A3B 39.3 GB, 122B-A10B 133.6 GB, 27B 32.7 GB.
    for name, seen in (("Qwen3.5-35B-A3B", 39.3), ("Qwen3.5-122B-A10B", 133.6), ("Qwen3.5-27B", 32.7)):
        e = estimate.estimate(resolve_model(name, 8), 4096, M3_ULTRA)
        assert 0.88 * seen <= e.total_bytes / 1e9 <= seen


def test_seed_kv_cache_figures_for_35b():
    arch = resolve_model("Qwen3.5-35B-A3B").arch
    assert estimate.kv_bytes_per_token(arch) == 20 * 1024  # 20 KiB per token at fp16
    assert estimate.kv_cache_bytes(arch, 262144) / 1e9 == pytest.approx(5.4, abs=0.05)
    assert estimate.kv_cache_bytes(arch, 262144, all_layers=True) / 1e9 == pytest.approx(21.5, abs=0.05)


def test_kv_cache_grows_in_256_token_steps_and_quantizes():
    arch = resolve_model("Qwen3.5-9B").arch
    assert estimate.kv_cache_bytes(arch, 1) == estimate.kv_cache_bytes(arch, 256)
    assert estimate.kv_cache_bytes(arch, 257) == estimate.kv_cache_bytes(arch, 512)
    full = estimate.kv_cache_bytes(arch, 65536)
    assert estimate.kv_cache_bytes(arch, 65536, kv_bits=8) / full == pytest.approx(8.5 / 16)
    assert estimate.kv_cache_bytes(arch, 65536, kv_bits=4) / full == pytest.approx(4.5 / 16)


def test_deltanet_state_is_fixed_and_float32():
    arch = resolve_model("Qwen3.5-35B-A3B").arch
    recurrent = 30 * 32 * 128 * 128 * 4
    conv = 30 * 3 * (2 * 2048 + 4096) * 2
    assert estimate.state_bytes(arch) == recurrent + conv
    small = estimate.estimate(resolve_model("Qwen3.5-35B-A3B"), 1024, M3_ULTRA)
    large = estimate.estimate(resolve_model("Qwen3.5-35B-A3B"), 262144, M3_ULTRA)
    assert small.state_bytes == large.state_bytes


def test_total_is_the_sum_of_its_parts_and_grows_with_context():
    model = resolve_model("Qwen3.5-27B", 4)
    machine = what_if_machine("M4 Max", 64 * GiB)
    totals = []
    for context in (1, 2048, 8192, 65536, 262144):
        e = estimate.estimate(model, context, machine)
        assert e.total_bytes == e.weights_bytes + e.kv_cache_bytes + e.state_bytes + e.overhead_bytes
        assert e.overhead_bytes == e.prefill_bytes + e.runtime_bytes
        totals.append(e.total_bytes)
    assert totals == sorted(totals) and totals[0] < totals[-1]


def test_verdicts_and_largest_context():
    model = resolve_model("Qwen3.5-35B-A3B", 4)
    assert estimate.estimate(model, 8192, what_if_machine("M4 Max", 128 * GiB)).verdict == "fits"
    assert estimate.estimate(model, 8192, what_if_machine("M4", 16 * GiB)).verdict == "too_big"
    machine = what_if_machine("M4 Pro", 24 * GiB)  # budget ≈ 17.8 GiB < 19.5 GB of weights
    e = estimate.estimate(model, 8192, machine)
    assert e.verdict == "too_big" and e.max_context == 0
    # 27B 4-bit on 24 GB: fits at short context, the largest context is where the total meets the budget.
    model = resolve_model("Qwen3.5-27B", 4)
    e = estimate.estimate(model, 4096, machine)
    assert 0 < e.max_context < 262144 and e.max_context % 256 == 0
    at_max = estimate.estimate(model, e.max_context, machine)
    beyond = estimate.estimate(model, e.max_context + 256, machine)
    assert at_max.total_bytes <= machine.budget_bytes < beyond.total_bytes
    assert at_max.verdict in ("fits", "tight") and beyond.verdict == "too_big"


def test_tight_band_is_between_ninety_percent_and_the_budget():
    model = resolve_model("Qwen3.5-27B", 4)
    machine = what_if_machine("M4 Pro", 24 * GiB)
    verdicts = {estimate.estimate(model, c, machine).verdict for c in range(1024, 262144, 1024)}
    assert verdicts == {"fits", "tight", "too_big"}


def test_kv_bits_raise_the_largest_context():
    model = resolve_model("Qwen3.5-27B", 4)
    machine = what_if_machine("M4 Pro", 24 * GiB)
    plain = estimate.estimate(model, 8192, machine).max_context
    assert estimate.estimate(model, 8192, machine, kv_bits=8).max_context > plain
    assert estimate.estimate(model, 8192, machine, kv_bits=4).max_context > estimate.estimate(model, 8192, machine, kv_bits=8).max_context


def test_exact_file_sizes_win_over_the_computed_figure():
    model = dataclasses.replace(resolve_model("Qwen3.5-9B", 4), weights_bytes=6_000_000_000)
    e = estimate.estimate(model, 4096, M3_ULTRA)
    assert e.weights_bytes == 6_000_000_000 and e.weights_exact


@pytest.mark.parametrize(
    "name, bits, chip, memory_gib, measured",
    [
        ("Qwen3.5-35B-A3B", 8, "M3 Ultra", 512, 80.6),  # seeds
        ("Qwen3.5-122B-A10B", 8, "M3 Ultra", 512, 42.5),  # seeds
        ("Qwen3.5-27B", 8, "M3 Ultra", 512, 21.3),  # seeds
        ("Qwen3.5-397B-A17B", 4, "M3 Ultra", 512, 39.0),  # published 4-bit MLX run
        ("Qwen3.5-122B-A10B", 4, "M5 Max", 128, 62.0),  # published M5 Max run, 60.6-65 tok/s
        ("Qwen3.5-4B", 4, "M4", 16, 39.0),  # published Mac mini M4 mlx_lm run
    ],
)
def test_decode_estimate_tracks_measurements(name, bits, chip, memory_gib, measured):
    e = estimate.estimate(resolve_model(name, bits), 2048, what_if_machine(chip, memory_gib * GiB))
    assert e.decode_tps_estimate == pytest.approx(measured, rel=0.12)


def test_decode_estimate_slows_with_context_and_is_absent_off_apple():
    from macapp.core.hardware import profile_from_facts

    model = resolve_model("Qwen3.5-35B-A3B", 4)
    e = estimate.estimate(model, 262144, what_if_machine("M4 Max", 128 * GiB))
    assert e.decode_tps_at_context < e.decode_tps_estimate
    linux = profile_from_facts("AMD EPYC", 24 * GiB, None, None, None)
    assert estimate.estimate(model, 4096, linux).decode_tps_estimate is None


@pytest.mark.parametrize("context", [0, -5, 1_010_001])  # past YaRN ×4's card limit
def test_context_out_of_range_is_refused(context):
    with pytest.raises(ValueError):
        estimate.estimate(resolve_model("Qwen3.5-9B"), context, M3_ULTRA)


def test_kv_bits_must_be_4_or_8():
    with pytest.raises(ValueError):
        estimate.estimate(resolve_model("Qwen3.5-9B"), 1024, M3_ULTRA, kv_bits=3)


def test_derivation_explains_each_term():
    e = estimate.estimate(resolve_model("Qwen3.5-35B-A3B"), 262144, what_if_machine("M4 Max", 128 * GiB))
    text = "\n".join(e.derivation)
    for words in ("weights", "10 of 40 layers", "if every layer cached", "DeltaNet", "budget", "tok/s", "estimate"):
        assert words in text
