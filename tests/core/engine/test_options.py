"""Session settings (macapp/core/engine/options.py): the prefill step is sizing's, KV settings as mlx-lm takes them."""

from __future__ import annotations

from macapp.core.fit import estimate
from macapp.core.engine import KVQuantization, SessionOptions


def test_the_prefill_step_is_the_one_sizing_estimates_with():
    assert SessionOptions().prefill_step_size == estimate.DEFAULT_PREFILL_STEP


def test_kv_settings_reach_mlx_lm_under_its_own_names():
    options = SessionOptions(kv_bits=4, kv_group_size=32, quantized_kv_start=256)
    assert options.kv == KVQuantization(bits=4, group_size=32, start=256)
    assert options.kv.kwargs() == {"kv_bits": 4, "kv_group_size": 32, "quantized_kv_start": 256}
    assert SessionOptions().kv.kwargs() == {"kv_bits": None, "kv_group_size": 64, "quantized_kv_start": 0}


def test_those_names_are_the_ones_mlx_lm_takes():
    import inspect

    from mlx_lm.generate import generate_step, maybe_quantize_kv_cache

    names = set(KVQuantization().kwargs())
    assert names <= set(inspect.signature(maybe_quantize_kv_cache).parameters)
    assert names <= set(inspect.signature(generate_step).parameters)
