"""The ways out of a too-big verdict, cheapest first, for every verdict case (4-bit builds included)."""

import pytest

from macapp.core import catalog
from macapp.core.fit import advice, estimate
from macapp.core.fit.advice import Remedy
from macapp.core.hardware import GiB, max_safe_wired_limit, profile_from_facts, what_if_machine, with_wired_limit

MiB = 1024**2
M4_PRO_24 = what_if_machine("M4 Pro", 24 * GiB)
CATALOG = [catalog.model_ref(e, e.build(b)) for e in catalog.load_catalog() for b in sorted(e.builds)]


def _advise(name, bits, machine, context, kv_bits=None, candidates=CATALOG):
    model = catalog.resolve_model(name, bits)
    est = estimate.estimate(model, context, machine, kv_bits=kv_bits)
    return est, advice.advise(model, est, machine, candidates)


def _in_cost_order(steps) -> bool:
    order = list(Remedy)
    positions = [order.index(s.remedy) for s in steps]
    return positions == sorted(positions)


@pytest.mark.parametrize("name, bits, context", [("Qwen3.5-9B", 4, 32768), ("Qwen3.5-27B", 4, 32768)])
def test_fits_and_tight_get_no_ways_out(name, bits, context):
    est, ways = _advise(name, bits, M4_PRO_24, context)
    assert est.verdict in ("fits", "tight")
    assert ways.steps == () and ways.lines() == [] and ways.verdict == est.verdict


def test_context_too_long_names_the_shorter_context_then_the_kv_cache_then_a_smaller_build():
    est, ways = _advise("Qwen3.5-27B", 4, M4_PRO_24, 120000)
    assert est.verdict == "too_big" and est.max_context > 0
    remedies = [s.remedy for s in ways.steps]
    assert remedies[0] is Remedy.SHORTER_CONTEXT and ways.steps[0].context == est.max_context
    assert f"{est.max_context:,} tokens" in ways.steps[0].text
    kv = next(s for s in ways.steps if s.remedy is Remedy.KV_CACHE)
    assert estimate.estimate(catalog.resolve_model("Qwen3.5-27B", 4), 120000, M4_PRO_24, kv_bits=kv.kv_bits).verdict != "too_big"
    # 24.7 GB is more than macOS can safely give on 24 GB: the raised limit comes with the longest context it allows.
    wired = next(s for s in ways.steps if s.remedy is Remedy.WIRED_LIMIT)
    assert est.max_context < wired.context < 120000 and f"up to {wired.context:,} tokens" in wired.text
    assert _in_cost_order(ways.steps)
    assert ways.lines()[0] == ways.headline and ways.lines()[1].startswith("1. use a shorter context")


def test_no_context_fits_but_a_raised_wired_limit_would_gives_the_exact_command():
    machine = M4_PRO_24
    est, ways = _advise("Qwen3.5-35B-A3B", 4, machine, 8192)
    assert est.verdict == "too_big" and est.max_context == 0
    assert ways.headline.startswith("No context fits")
    step = ways.steps[0]
    assert step.remedy is Remedy.WIRED_LIMIT
    assert step.command == f"sudo sysctl iogpu.wired_limit_mb={step.wired_limit_mb}"
    assert step.wired_limit_mb * MiB <= max_safe_wired_limit(machine.memory_bytes)
    assert step.leaves_bytes == machine.memory_bytes - step.wired_limit_mb * MiB and step.leaves_bytes >= 4 * GiB
    for words in ("resets at reboot", "iogpu.wired_limit_mb=0", "Risk", "swaps", "never changes this setting"):
        assert words in step.text
    # The command really makes it fit: the same estimate on the raised budget is no longer too big.
    raised = with_wired_limit(machine, step.wired_limit_mb * MiB)
    assert estimate.estimate(catalog.resolve_model("Qwen3.5-35B-A3B", 4), 8192, raised).verdict != "too_big"
    assert _in_cost_order(ways.steps)


def test_at_32k_on_a_24gb_m4_pro_the_wired_limit_comes_with_the_longest_context_it_allows():
    # The headline case (issue 34): the 35B-A3B 4-bit holds no context on the default budget and not the whole 32K even
    # at the most macOS can safely give; together, the raised limit and a shorter context make it run.
    model = catalog.resolve_model("Qwen3.5-35B-A3B", 4)
    est, ways = _advise("Qwen3.5-35B-A3B", 4, M4_PRO_24, 32768)
    assert est.verdict == "too_big" and est.max_context == 0
    assert est.total_bytes > max_safe_wired_limit(M4_PRO_24.memory_bytes)  # the limit alone is not enough
    step = ways.steps[0]
    assert step.remedy is Remedy.WIRED_LIMIT
    assert step.wired_limit_mb * MiB == max_safe_wired_limit(M4_PRO_24.memory_bytes) // MiB * MiB  # the most it can give
    assert step.command == f"sudo sysctl iogpu.wired_limit_mb={step.wired_limit_mb}"
    raised = with_wired_limit(M4_PRO_24, step.wired_limit_mb * MiB)
    # The context it names is the longest that fits on the raised budget: one KV step more does not.
    assert 0 < step.context < 32768 and step.context == estimate.max_context(model, raised.budget_bytes)
    assert estimate.estimate(model, step.context, raised).verdict != "too_big"
    assert estimate.estimate(model, step.context + estimate.KV_STEP, raised).verdict == "too_big"
    assert f"a context of up to {step.context:,} tokens" in step.text and "you asked for 32,768" in step.text
    # ... and a quantized cache on top holds the whole 32K there: named in the same step.
    assert "`--kv-bits 8`" in step.text and estimate.estimate(model, 32768, raised, kv_bits=8).verdict != "too_big"
    assert ways.lines()[1].startswith("1. let macOS wire more memory for the GPU")
    assert _in_cost_order(ways.steps)


def test_the_wired_limit_that_holds_the_whole_context_names_that_context():
    _, ways = _advise("Qwen3.5-35B-A3B", 4, M4_PRO_24, 8192)
    step = ways.steps[0]
    assert step.remedy is Remedy.WIRED_LIMIT and step.context == 8192 and "the whole 8,192-token context" in step.text


def test_a_4bit_build_with_no_context_is_never_told_to_use_4bit():
    est, ways = _advise("Qwen3.5-397B-A17B", 4, what_if_machine("M4 Max", 128 * GiB), 32768)
    assert est.verdict == "too_big" and est.max_context == 0
    text = "\n".join(ways.lines())
    assert "4-bit" not in text.replace("Qwen3.5-397B-A17B 4-bit", "").replace("Qwen3.5-122B-A10B 4-bit", "")
    smaller = next(s for s in ways.steps if s.remedy is Remedy.SMALLER_BUILD)
    assert smaller.model == "Qwen3.5-122B-A10B 4-bit"  # the biggest build that does fit (the 8-bit 122B does not)
    assert Remedy.WIRED_LIMIT not in [s.remedy for s in ways.steps]  # 227 GB is beyond any limit on 128 GB


def test_an_8bit_build_can_step_down_to_the_same_model_at_4bit():
    est, ways = _advise("Qwen3.5-9B", 8, what_if_machine("M4", 16 * GiB), 131072)
    assert est.verdict == "too_big"
    smaller = next(s for s in ways.steps if s.remedy is Remedy.SMALLER_BUILD)
    assert smaller.model == "Qwen3.5-9B 4-bit" and smaller.repo == "mlx-community/Qwen3.5-9B-4bit"
    built = catalog.resolve_model(smaller.repo)
    assert estimate.estimate(built, smaller.context, what_if_machine("M4", 16 * GiB)).verdict != "too_big"
    assert _in_cost_order(ways.steps)


def test_a_quantized_kv_cache_is_not_suggested_again():
    _, ways = _advise("Qwen3.5-27B", 4, M4_PRO_24, 262144, kv_bits=4)
    assert Remedy.KV_CACHE not in [s.remedy for s in ways.steps]


def test_when_nothing_helps_the_headline_says_so():
    est, ways = _advise("Qwen3.5-397B-A17B", 8, what_if_machine("M4", 16 * GiB), 8192, candidates=())
    assert est.verdict == "too_big" and ways.steps == ()
    assert "Nothing fixes that on this Mac" in ways.headline


def test_no_wired_limit_advice_off_apple_silicon():
    linux = profile_from_facts("AMD EPYC", 24 * GiB, None, None, None)
    _, ways = _advise("Qwen3.5-35B-A3B", 4, linux, 8192)
    assert Remedy.WIRED_LIMIT not in [s.remedy for s in ways.steps]


def test_json_is_plain_data():
    import json

    _, ways = _advise("Qwen3.5-35B-A3B", 4, M4_PRO_24, 8192)
    data = json.loads(json.dumps(ways.to_json()))
    assert data["verdict"] == "too_big" and data["steps"][0]["remedy"] == "wired_limit"
    assert data["steps"][0]["command"].startswith("sudo sysctl iogpu.wired_limit_mb=")


def test_the_same_model_at_4bit_comes_before_a_bigger_other_build():
    # 35B-A3B 8-bit on a 48 GB M4 Pro at 128K: the 27B 8-bit is bigger than the 35B-A3B 4-bit and fits too, but the
    # same model at 4-bit keeps its quality class and its speed (3B active), so that is the step offered.
    machine = what_if_machine("M4 Pro", 48 * GiB)
    est, ways = _advise("Qwen3.5-35B-A3B", 8, machine, 131072)
    assert est.verdict == "too_big"
    other = estimate.estimate(catalog.resolve_model("Qwen3.5-27B", 8), 131072, machine)
    assert other.verdict != "too_big" and other.weights_bytes > estimate.estimate(catalog.resolve_model("Qwen3.5-35B-A3B", 4), 131072, machine).weights_bytes
    smaller = next(s for s in ways.steps if s.remedy is Remedy.SMALLER_BUILD)
    assert smaller.model == "Qwen3.5-35B-A3B 4-bit"
