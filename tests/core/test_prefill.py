"""The prompt-reading (prefill) model against the public Apple measurements it was calibrated on, and its shape."""

import pytest

from macapp.core import prefill, sizing
from macapp.core.catalog import resolve_model
from macapp.core.hardware import BANDWIDTH_EFFICIENCY, GiB, profile_from_facts, what_if_machine

# Qwen3 (full attention everywhere) from their published configs, as mlx-lm's own benchmarks ran them.
QWEN3_4B = prefill.transformer_workload(2560, 36, 32, 8, 128, intermediate=9728)
QWEN3_06B = prefill.transformer_workload(1024, 28, 16, 8, 128, intermediate=3072)
QWEN3_30B_A3B = prefill.transformer_workload(2048, 48, 32, 4, 128, experts=128, routed=8, expert_intermediate=768)


def _first_token_s(work, machine) -> float:
    return work.weights_bytes / (machine.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY)


# (workload or (catalog name, bits), chip, RAM GiB, GPU cores, prompt tokens, measured prompt tok/s, tolerance)
# Tolerance ±15% for every run the constants were fitted to; ±20% for ollama's own MLX engine (nvfp4 weights).
CALIBRATION = {
    # mlx-lm BENCHMARKS.md (M4 Max 64 GB, mlx-lm 0.28.2, `mlx_lm.benchmark -p 2048 -g 128`)
    "mlx-lm BENCHMARKS.md Qwen3-4B 4-bit M4 Max": (QWEN3_4B, "M4 Max", 64, 40, 2048, 1622.3, 0.15),
    # mlx-lm PR #406 (M4 Max, after "only apply lm_head to the last token")
    "mlx-lm #406 Qwen3-30B-A3B 4-bit M4 Max p2048": (QWEN3_30B_A3B, "M4 Max", 64, 40, 2048, 1732.0, 0.15),
    "mlx-lm #406 Qwen3-30B-A3B 4-bit M4 Max p512": (QWEN3_30B_A3B, "M4 Max", 64, 40, 512, 1480.3, 0.15),
    "mlx-lm #406 Qwen3-0.6B 4-bit M4 Max p2048": (QWEN3_06B, "M4 Max", 64, 40, 2048, 10278.8, 0.15),
    "mlx-lm #406 Qwen3-0.6B 4-bit M4 Max p512": (QWEN3_06B, "M4 Max", 64, 40, 512, 9520.4, 0.15),
    # mlx-lm PR #1569 (MacBook Pro M3 Pro 18 GB, mlx-lm 0.31.3, mlx_lm.benchmark -p 2048; 18-core GPU assumed)
    "mlx-lm #1569 Qwen3-4B 4-bit M3 Pro": (QWEN3_4B, "M3 Pro", 18, 18, 2048, 615.3, 0.15),
    # nicedreamzapp/claude-code-local #31 (mlx_lm.benchmark, Qwen3.6-35B-A3B-UD-MLX-4bit, "M4 Studio" 64 GB: a
    # Mac Studio M4 Max, 40-core with 64 GB; its decode, 101.6 tok/s, matches our 98.6 for that chip)
    "claude-code-local #31 Qwen3.6-35B-A3B M4 Max p512": (("Qwen3.5-35B-A3B", 4), "M4 Max", 64, 40, 512, 1518.2, 0.15),
    "claude-code-local #31 Qwen3.6-35B-A3B M4 Max p1024": (("Qwen3.5-35B-A3B", 4), "M4 Max", 64, 40, 1024, 1777.4, 0.15),
    # ml-explore/mlx-lm #1480 (M5 Max 128 GB, mlx 0.32.0, mlx-lm 0.31.3, mlx-community/Qwen3.6-35B-A3B-4bit)
    "mlx-lm #1480 Qwen3.6-35B-A3B M5 Max 8k": (("Qwen3.5-35B-A3B", 4), "M5 Max", 128, 40, 8192, 3909.0, 0.15),
    "mlx-lm #1480 Qwen3.6-35B-A3B M5 Max 32k": (("Qwen3.5-35B-A3B", 4), "M5 Max", 128, 40, 32768, 3316.0, 0.15),
    "mlx-lm #1480 Qwen3.6-35B-A3B M5 Max 64k": (("Qwen3.5-35B-A3B", 4), "M5 Max", 128, 40, 65536, 2388.0, 0.15),
    "mlx-lm #1480 Qwen3.6-35B-A3B M5 Max 100k": (("Qwen3.5-35B-A3B", 4), "M5 Max", 128, 40, 100000, 1758.0, 0.15),
    "mlx-lm #1480 Qwen3.6-35B-A3B M5 Max 130k": (("Qwen3.5-35B-A3B", 4), "M5 Max", 128, 40, 130000, 1390.0, 0.15),
    # openclawradar.com, April 2026 (MLX, M2 Ultra 128 GB, 5-bit; 60-core bin assumed): 128K-token TTFT 19.3 min
    "M2 Ultra Qwen3.5-122B-A10B 128K TTFT": (("Qwen3.5-122B-A10B", 4), "M2 Ultra", 128, 60, 131072, 131072 / 1158, 0.15),
    # Rapid-MLX #3157 (stock mlx-lm, chunk 2048, M2 Max 32 GB, 30-core bin assumed, 2,726 tokens): Qwen3.8-27B-4bit
    "Rapid-MLX #3157 Qwen3.8-27B M2 Max": (("Qwen3.5-27B", 4), "M2 Max", 32, 30, 2726, 140.0, 0.15),
    # incoai/splash #37 (MLX server, 8-bit, M5 Max 40-core): Qwen3.8-27B, 22.4k-token prefill
    "splash #37 Qwen3.8-27B 8-bit M5 Max 22.4k": (("Qwen3.5-27B", 8), "M5 Max", 128, 40, 22400, 675.0, 0.15),
    # ollama #17884 (its own MLX engine 0.32.9, qwen3.6:27b-mlx nvfp4, 2,349 tokens; 562-634 tok/s)
    "ollama #17884 Qwen3.6-27B M5 Max": (("Qwen3.5-27B", 4), "M5 Max", 128, 40, 2349, 598.0, 0.20),
}


@pytest.mark.parametrize("source", CALIBRATION)
def test_prefill_estimate_tracks_public_measurements(source):
    work, chip, ram, cores, tokens, measured, tolerance = CALIBRATION[source]
    machine = what_if_machine(chip, ram * GiB, cores)
    if isinstance(work, tuple):
        estimated = sizing.prefill_estimate(resolve_model(*work), machine, tokens).tps
    else:
        estimated = prefill.estimate_prefill(work, machine, tokens, 2048, _first_token_s(work, machine)).tps
    assert estimated / measured == pytest.approx(1.0, abs=tolerance)


def test_qwen3_workload_counts_the_published_parameters():
    assert QWEN3_4B.matmul_flops / 2 / 1e9 == pytest.approx(3.6, rel=0.03)  # 4.0B minus the embedding
    assert QWEN3_30B_A3B.matmul_flops / 2 / 1e9 == pytest.approx(2.7, rel=0.05)  # "A3B" minus the embedding
    assert QWEN3_30B_A3B.expert_rows_share == 8 / 128


def test_moe_work_counts_routed_and_shared_experts_only():
    arch = resolve_model("Qwen3.5-35B-A3B").arch
    work = sizing.prefill_workload(resolve_model("Qwen3.5-35B-A3B", 4))
    routed = arch.num_hidden_layers * 3 * 8 * arch.moe_intermediate_size * arch.hidden_size
    assert work.expert_flops == 2 * routed
    # active parameters without the embedding and output head: ~2.5B of the "A3B"
    assert work.matmul_flops / 2 / 1e9 == pytest.approx(2.45, rel=0.05)


def test_short_prompts_pay_per_chunk_costs_and_long_ones_pay_attention():
    model = resolve_model("Qwen3.5-35B-A3B", 4)
    machine = what_if_machine("M4 Max", 128 * GiB)
    tps = {n: sizing.prefill_estimate(model, machine, n).tps for n in (500, 2048, 20000, 131072)}
    assert tps[500] < tps[2048]  # a short prompt's chunk has few rows per matrix and still reads every weight
    assert tps[20000] < tps[2048] and tps[131072] < 0.5 * tps[20000]  # attention grows with the context
    long = sizing.prefill_estimate(model, machine, 131072)
    assert long.attention_s > long.matmul_s
    short = sizing.prefill_estimate(model, machine, 500)
    assert short.attention_s < 0.05 * short.seconds


def test_time_to_first_token_grows_with_the_prompt_and_smaller_chunks_are_slower():
    model = resolve_model("Qwen3.5-9B", 4)
    machine = what_if_machine("M4 Pro", 48 * GiB)
    times = [sizing.prefill_estimate(model, machine, n).seconds for n in (500, 2048, 8192, 32768, 131072)]
    assert times == sorted(times)
    assert sizing.prefill_estimate(model, machine, 8192, prefill_step=512).seconds > times[2]


def test_moe_reads_short_prompts_less_efficiently_than_long_ones():
    work = sizing.prefill_workload(resolve_model("Qwen3.5-35B-A3B", 4))
    assert prefill.expert_efficiency(work, 512) < prefill.expert_efficiency(work, 2048) < prefill.EXPERT_EFF
    assert prefill.dense_efficiency(512) < prefill.dense_efficiency(2048) < prefill.DENSE_EFF


def test_m5_neural_accelerators_change_prompt_reading_not_decode():
    model = resolve_model("Qwen3.5-27B", 4)
    m4 = sizing.estimate(model, 20000, what_if_machine("M4 Max", 128 * GiB, 40))
    m5 = sizing.estimate(model, 20000, what_if_machine("M5 Max", 128 * GiB, 40))
    assert m5.prefill_tps_estimate > 2.5 * m4.prefill_tps_estimate
    assert m5.decode_tps_estimate < 1.3 * m4.decode_tps_estimate


def test_estimate_carries_the_reading_figures_and_explains_them():
    e = sizing.estimate(resolve_model("Qwen3.5-35B-A3B", 4), 20000, what_if_machine("M4 Pro", 48 * GiB))
    assert e.ttft_estimate_s == pytest.approx(20000 / e.prefill_tps_estimate, rel=0.01)
    assert e.to_json()["ttft_estimate_s"] == e.ttft_estimate_s
    line = next(line for line in e.derivation if line.startswith("reading a 20,000-token prompt"))
    for words in ("GFLOP per token", "TFLOPS", "attention", "DeltaNet", "estimate"):
        assert words in line


def test_no_reading_estimate_off_apple_silicon():
    linux = profile_from_facts("AMD EPYC", 64 * GiB, None, None, None)
    e = sizing.estimate(resolve_model("Qwen3.5-9B", 4), 4096, linux)
    assert e.prefill_tps_estimate is None and e.ttft_estimate_s is None
    assert not any(line.startswith("reading a") for line in e.derivation)


@pytest.mark.parametrize(
    "seconds, text",
    [(0.42, "0.4 s"), (12.4, "12 s"), (75, "1 min 15 s"), (1337, "22 min"), (3900, "1 h 5 min"), (7200, "2 h")],
)
def test_format_duration(seconds, text):
    assert prefill.format_duration(seconds) == text
