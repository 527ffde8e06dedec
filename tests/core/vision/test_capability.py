"""Which builds see: vision_config AND tower weights; exact tower bytes from the safetensors headers."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx

from macapp.core.vision import capability


def test_a_build_with_its_tower_sees_and_its_bytes_are_the_towers(tiny_vlm_path):
    support = capability.folder_support(tiny_vlm_path)
    assert support.sees and support.exact and support.why_not == ""
    weights = mx.load(str(tiny_vlm_path / "model.safetensors"))
    tower = {k: v for k, v in weights.items() if k.startswith("vision_tower.")}
    assert support.tower_tensors == len(tower) > 0
    assert support.tower_bytes == sum(v.nbytes for v in tower.values())


def test_vision_config_without_tower_weights_is_text_only(tiny_vlm_text_only_path):
    folder = tiny_vlm_text_only_path
    assert "vision_config" in json.loads((folder / "config.json").read_text())
    support = capability.folder_support(folder)
    assert not support.sees and support.tower_bytes == 0
    assert "no vision tower" in support.why_not


def test_tower_weights_without_vision_config_are_text_only(tiny_vlm_path, tmp_path):
    folder = tmp_path / "no-config"
    shutil.copytree(tiny_vlm_path, folder)
    config = json.loads((folder / "config.json").read_text())
    del config["vision_config"]
    (folder / "config.json").write_text(json.dumps(config))
    support = capability.folder_support(folder)
    assert not support.sees and support.tower_tensors > 0
    assert "vision_config" in support.why_not


def test_unreadable_headers_fall_back_to_the_index(tiny_vlm_path, tmp_path):
    folder = tmp_path / "broken"
    shutil.copytree(tiny_vlm_path, folder)
    (folder / "model.safetensors").write_bytes(b"\xff" * 16)
    support = capability.folder_support(folder)
    assert support.sees and not support.exact and support.tower_bytes == 0


def test_hub_metadata_pairs_and_both_layouts_count():
    config = {"vision_config": {"depth": 1}}
    pairs = [("model.visual.blocks.0.attn.qkv.weight", 100), ("vision_tower.merger.linear_fc1.weight", 20), ("model.language_model.embed_tokens.weight", 999)]
    support = capability.support_from_tensors(config, pairs)
    assert support.sees and support.tower_bytes == 120 and support.tower_tensors == 2
    assert not capability.support_from_tensors(config, pairs[2:]).sees


def test_text_only_message_names_the_build_and_what_to_do():
    message = capability.text_only_message("Qwen3.5-397B-A17B-4bit", "Qwen3.5-397B-A17B (8-bit)")
    assert message.startswith("Qwen3.5-397B-A17B-4bit: this build is text-only: use Qwen3.5-397B-A17B (8-bit)")
    assert "qwen-desk models" in capability.text_only_message("x")
