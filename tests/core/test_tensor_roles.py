"""One role per tensor (macapp/core/tensor_roles.py), checked against the real loaders' sanitize."""

from __future__ import annotations

import json
from types import SimpleNamespace

import mlx.core as mx
import pytest

from macapp.core import upstream
from macapp.core.tensor_roles import TensorRole, bytes_by_role, is_mtp_tensor, is_tower_tensor, loaded_by_mlx_lm, tensor_role, tied_embeddings

# Key names as the real conversions write them: mlx-community MLX builds (mlx-lm / mlx-vlm convert), the original
# Qwen checkpoints (Hugging Face layout, MTP head included), and the nested-visual layout mlx-vlm also reads.
LAYOUTS = [
    ("language_model.model.layers.0.linear_attn.in_proj_qkvz.weight", TensorRole.LANGUAGE),
    ("language_model.model.layers.3.self_attn.q_proj.scales", TensorRole.LANGUAGE),
    ("language_model.model.embed_tokens.weight", TensorRole.LANGUAGE),
    ("language_model.lm_head.weight", TensorRole.LANGUAGE),
    ("vision_tower.blocks.0.attn.qkv.weight", TensorRole.VISION),
    ("vision_tower.merger.linear_fc1.weight", TensorRole.VISION),
    ("model.language_model.layers.0.mlp.experts.gate_up_proj", TensorRole.LANGUAGE),
    ("model.language_model.norm.weight", TensorRole.LANGUAGE),
    ("lm_head.weight", TensorRole.LANGUAGE),
    ("model.visual.blocks.0.attn.qkv.weight", TensorRole.VISION),
    ("model.visual.patch_embed.proj.weight", TensorRole.VISION),
    ("model.language_model.visual.blocks.0.attn.qkv.weight", TensorRole.VISION),  # the layout the two old checks disagreed on
    ("mtp.fc.weight", TensorRole.MTP),
    ("mtp.pre_fc_norm_embedding.weight", TensorRole.MTP),
    ("mtp.pre_fc_norm_hidden.weight", TensorRole.MTP),
    ("mtp.layers.0.self_attn.q_proj.weight", TensorRole.MTP),
    ("mtp.layers.0.mlp.experts.7.down_proj.weight", TensorRole.MTP),
    ("mtp.layers.0.mlp.shared_expert_gate.weight", TensorRole.MTP),
    ("mtp.norm.weight", TensorRole.MTP),
    ("language_model.mtp.fc.weight", TensorRole.MTP),  # both loaders drop any key containing "mtp."
]


@pytest.mark.parametrize("name, role", LAYOUTS)
def test_every_layout_has_one_role(name, role):
    assert tensor_role(name) is role
    assert is_tower_tensor(name) == (role is TensorRole.VISION)
    assert is_mtp_tensor(name) == (role is TensorRole.MTP)
    assert loaded_by_mlx_lm(name) == (role is TensorRole.LANGUAGE)


def test_a_tied_lm_head_is_neither_loaded_nor_counted():
    assert tensor_role("lm_head.weight", tied_embeddings=True) is TensorRole.OTHER
    assert tensor_role("language_model.lm_head.weight", tied_embeddings=True) is TensorRole.OTHER
    assert tensor_role("language_model.model.embed_tokens.weight", tied_embeddings=True) is TensorRole.LANGUAGE
    assert tied_embeddings({"text_config": {"tie_word_embeddings": True}, "tie_word_embeddings": False})
    assert tied_embeddings({"tie_word_embeddings": True}) and not tied_embeddings({})


def test_bytes_by_role_lists_every_role():
    totals = bytes_by_role([("mtp.fc.weight", 10), ("vision_tower.x", 5), ("language_model.model.norm.weight", 2), ("lm_head.weight", 7)], tied_embeddings=True)
    assert totals == {TensorRole.LANGUAGE: 2, TensorRole.VISION: 5, TensorRole.MTP: 10, TensorRole.OTHER: 7}


def _hub_weights_with_nested_visual(folder):
    weights = mx.load(str(folder / "model.safetensors"))
    weights["model.language_model.visual.blocks.0.norm1.weight"] = mx.zeros((64,))
    return weights


def test_the_roles_match_mlx_lms_sanitize_on_a_real_hub_layout_checkpoint(tiny_hub_layout_path):
    """The language tensors are exactly what mlx-lm's sanitize keeps (it renames and splits them, bytes unchanged)."""
    config = json.loads((tiny_hub_layout_path / "config.json").read_text())
    model_class, args_class = upstream.text_model_classes(config)
    model = model_class(args_class.from_dict(config))
    weights = mx.load(str(tiny_hub_layout_path / "model.safetensors"))
    roles = {name: tensor_role(name, tied_embeddings(config)) for name in weights}
    assert {TensorRole.LANGUAGE, TensorRole.VISION, TensorRole.MTP} <= set(roles.values())
    kept = model.sanitize(dict(weights))
    assert sum(v.nbytes for v in kept.values()) == sum(weights[n].nbytes for n, r in roles.items() if r is TensorRole.LANGUAGE)
    assert not any("mtp." in k or k.startswith(("vision_tower", "model.visual")) for k in kept)


def test_the_roles_match_mlx_vlms_sanitize_tower_included(tiny_hub_layout_path):
    """mlx-vlm keeps the tower (renamed vision_tower.*), the nested model.language_model.visual layout included."""
    config = json.loads((tiny_hub_layout_path / "config.json").read_text())
    weights = _hub_weights_with_nested_visual(tiny_hub_layout_path)
    if "vision_config" not in config:
        pytest.fail("the tiny hub-layout model has no vision_config: this check needs one")
    model_module = upstream.vlm_model_module(config)
    model_config = model_module.ModelConfig.from_dict(config)
    model_config.text_config = model_module.TextConfig.from_dict(config["text_config"])
    model_config.vision_config = model_module.VisionConfig.from_dict(config["vision_config"])
    # sanitize reads only the config: the real method, without building the tower's modules
    model = SimpleNamespace(config=model_config, sanitize=lambda w: model_module.Model.sanitize(model, w))
    kept = model.sanitize(dict(weights))
    tower = sum(v.nbytes for k, v in kept.items() if k.startswith("vision_tower"))
    assert tower == sum(v.nbytes for k, v in weights.items() if tensor_role(k) is TensorRole.VISION) > 0
    assert not any("mtp." in k for k in kept)
