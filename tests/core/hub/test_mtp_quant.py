"""The head's quantization rule (macapp/core/hub/mtp_quant.py) is mlx-lm's: checked on mlx-lm's own 4-bit conversion."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest

from macapp.core.hub.mtp_quant import QuantRule


@pytest.mark.parametrize("kind", ["moe", "dense"])
def test_the_rule_picks_the_layers_bits_and_bytes_mlx_lm_chose(kind, tiny_moe_path, tiny_moe_4bit_path, tiny_dense_path, tiny_dense_4bit_path):
    plain, built = (tiny_moe_path, tiny_moe_4bit_path) if kind == "moe" else (tiny_dense_path, tiny_dense_4bit_path)
    config = json.loads((built / "config.json").read_text())
    quant = config["quantization"]
    source = mx.load(str(plain / "model.safetensors"))
    quantized = mx.load(str(built / "model.safetensors"))
    rule = QuantRule(bits=quant["bits"], group_size=quant["group_size"], dtype="F32", moe=kind == "moe")
    checked = 0
    for name, value in source.items():
        if not name.endswith(".weight"):
            continue
        stem = name[: -len(".weight")]
        spec = rule.spec(name, tuple(value.shape))
        if f"{stem}.scales" not in quantized:
            assert spec is None, name
            continue
        override = quant.get(stem) if isinstance(quant.get(stem), dict) else {}
        assert spec == (override.get("bits", quant["bits"]), override.get("group_size", quant["group_size"])), name
        stored = sum(quantized[f"{stem}.{part}"].nbytes for part in ("weight", "scales", "biases"))
        assert rule.stored_bytes(name, tuple(value.shape)) == stored, name
        checked += 1
    assert checked > 5
    if kind == "moe":
        assert any(rule.spec(n, tuple(v.shape)) == (8, 64) for n, v in source.items() if n.endswith("mlp.gate.weight"))


def test_quantize_gives_mlx_quantize_of_the_cast_weights_and_keeps_norms():
    rule = QuantRule(bits=4, group_size=64, dtype="BF16")
    weights = {"mtp.fc.weight": mx.random.normal((64, 128)), "mtp.norm.weight": mx.ones((64,)), "mtp.odd.weight": mx.ones((8, 10))}
    out = rule.quantize(weights)
    packed, scales, biases = mx.quantize(weights["mtp.fc.weight"].astype(mx.bfloat16), group_size=64, bits=4)
    assert mx.array_equal(out["mtp.fc.weight"], packed).item() and mx.array_equal(out["mtp.fc.scales"], scales).item()
    assert mx.array_equal(out["mtp.fc.biases"], biases).item()
    assert out["mtp.norm.weight"].dtype == mx.bfloat16 and "mtp.norm.scales" not in out
    assert "mtp.odd.scales" not in out  # 10 columns: not a whole group, mlx-lm leaves it unquantized too
    assert QuantRule(bits=None).quantize(weights).keys() == weights.keys()
