"""A build's weight bytes and parameters (macapp.core.fit.weights) against mlx-lm's real model classes and the names."""

import dataclasses

import pytest

from macapp.core import upstream
from macapp.core.catalog import load_catalog, resolve_model
from macapp.core.fit import weights


def mlx_lm_weight_bytes(arch, bits):
    """Build the real mlx-lm model lazily (shapes only, nothing allocated), quantize it as mlx_lm.convert does, sum bytes."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import quantize_model

    config = {"model_type": "qwen3_5_moe" if arch.is_moe else "qwen3_5", "text_config": dataclasses.asdict(arch)}
    model_class, args_class = upstream.text_model_classes(config)
    model = model_class(args_class.from_dict(config))
    # Checkpoints are bf16 except A_log, which mlx-lm keeps in float32 (cast_predicate).
    model.update(tree_unflatten([(k, v if k.endswith("A_log") else v.astype(mx.bfloat16)) for k, v in tree_flatten(model.parameters())]))
    if bits:
        quantize_model(model, config, 64, bits)
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


@pytest.mark.parametrize("entry", load_catalog(), ids=lambda e: e.name)
def test_computed_weights_equal_mlx_lm_quantized_model(entry):
    for bits in (4, 8):
        assert weights.computed_weights_bytes(entry.arch, bits) == mlx_lm_weight_bytes(entry.arch, bits)


def test_parameter_counts_match_the_names():
    expected = {"Qwen3.5-0.8B": 0.75, "Qwen3.5-27B": 26.9, "Qwen3.5-35B-A3B": 34.7, "Qwen3.5-122B-A10B": 122.1, "Qwen3.5-397B-A17B": 396.3}
    for entry in load_catalog():
        if entry.name in expected:
            assert weights.parameter_count(entry.arch) / 1e9 == pytest.approx(expected[entry.name], rel=0.01)
    moe = resolve_model("Qwen3.5-35B-A3B").arch
    assert weights.parameter_count(moe, active_only=True) / 1e9 == pytest.approx(3.0, rel=0.05)  # "A3B"
