"""The catalog: built-in data, resolving names / repos / folders, configs with nonsense values."""

import json
from pathlib import Path
from dataclasses import replace

import pytest

from macapp.core import catalog
from macapp.core.catalog import Arch, ConfigError, UnknownModel

REFERENCE = Path(__file__).parent / "recorded"  # copies of the published configs (shared/reference/configs)
SIZES = ["0.8B", "2B", "4B", "9B", "27B", "35B-A3B", "122B-A10B", "397B-A17B"]


def test_catalog_has_the_whole_family_in_4_and_8_bit():
    entries = catalog.load_catalog()
    assert [e.name for e in entries] == [f"Qwen3.5-{s}" for s in SIZES]
    for entry in entries:
        assert set(entry.builds) == {4, 8}
        assert entry.build(4).repo == f"mlx-community/{entry.name}-4bit"
        assert entry.arch.full_attention_layers * 4 == entry.arch.num_hidden_layers  # 1 layer in 4 keeps a KV cache


def test_builtin_rows_agree_with_the_published_configs():
    by_name = {e.name: e.arch for e in catalog.load_catalog()}
    for name, filename in [
        ("Qwen3.5-0.8B", "Qwen3.5-0.8B.config.json"),
        ("Qwen3.5-35B-A3B", "Qwen3.5-35B-A3B.config.json"),
        ("Qwen3.5-122B-A10B", "Qwen3.5-122B-A10B.text_config.json"),
    ]:
        config = json.loads((REFERENCE / filename).read_text())
        config.setdefault("model_type", "qwen3_5_moe")
        assert Arch.from_config(config) == by_name[name]


@pytest.mark.parametrize("spec", ["Qwen3.5-35B-A3B", "qwen3.5-35b-a3b", "QWEN3.5-35B-A3B", "mlx-community/Qwen3.5-35B-A3B-4bit", "Qwen3.5-35B-A3B-4bit"])
def test_resolve_names_and_repo_ids(spec):
    ref = catalog.resolve_model(spec)
    assert ref.name == "Qwen3.5-35B-A3B" and ref.bits == 4 and ref.repo == "mlx-community/Qwen3.5-35B-A3B-4bit"


def test_resolve_bits_and_8bit_suffix():
    assert catalog.resolve_model("Qwen3.5-9B", 8).repo == "mlx-community/Qwen3.5-9B-8bit"
    assert catalog.resolve_model("qwen3.5-9b-8bit").bits == 8


def test_unknown_name_suggests_close_ones():
    with pytest.raises(UnknownModel, match="Did you mean.*Qwen3.5-35B-A3B"):
        catalog.resolve_model("Qwen3.5-35B")
    with pytest.raises(UnknownModel, match="no model given"):
        catalog.resolve_model("  ")
    with pytest.raises(UnknownModel, match="not a folder"):
        catalog.resolve_model("./no/such/folder")


def _write_folder(folder: Path, config: dict, weights: bytes = b"") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if weights:
        (folder / "model.safetensors").write_bytes(weights)
    return folder


def test_local_folder_uses_its_config_and_exact_file_sizes(tmp_path):
    config = json.loads((REFERENCE / "Qwen3.5-35B-A3B.config.json").read_text())
    config["quantization"] = {"group_size": 64, "bits": 8}
    folder = _write_folder(tmp_path / "my-model", config, b"x" * 1000)
    ref = catalog.resolve_model(str(folder))
    assert ref.origin == "local" and ref.local_path == folder
    assert ref.bits == 8 and ref.weights_bytes == 1000
    assert ref.arch.num_experts == 256


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_size": -1}, "hidden_size"),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"num_key_value_heads": "two"}, "num_key_value_heads"),
        ({"num_key_value_heads": 64}, "exceeds"),
        ({"num_experts_per_tok": 999}, "exceeds"),
        ({"vocab_size": None}, "vocab_size"),
        ({"model_type": "llama"}, "not a Qwen3.5 model"),
    ],
)
def test_nonsense_configs_are_refused_with_the_field_named(tmp_path, change, message):
    config = json.loads((REFERENCE / "Qwen3.5-35B-A3B.config.json").read_text())
    config["text_config"].update(change)
    if "model_type" in change:
        config["model_type"] = change["model_type"]
    folder = _write_folder(tmp_path / "bad", config)
    with pytest.raises(ConfigError, match=message):
        catalog.resolve_model(str(folder))


def test_folder_without_config_or_with_broken_json(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UnknownModel, match="config.json"):
        catalog.resolve_model(str(tmp_path / "empty"))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        catalog.resolve_model(str(tmp_path / "broken"))


def test_offline_unknown_repo_says_so(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UnknownModel, match="HF_HUB_OFFLINE"):
        catalog.resolve_model("someone/Qwen3.5-custom-4bit")


def test_refreshed_sizes_and_config_override_builtin(tmp_path):
    from macapp.core.hub.record import HubFile, HubModelRecord, store_records

    repo = "mlx-community/Qwen3.5-9B-4bit"
    config = {"model_type": "qwen3_5", "text_config": {**catalog.builtin_catalog()[3].arch.__dict__, "max_position_embeddings": 131072}}
    record = HubModelRecord(repo=repo, revision="0" * 40, config=config, files=(HubFile("model.safetensors", 5_100_000_000, "e"),), headers_error="not read")
    store_records([record])
    ref = catalog.resolve_model("Qwen3.5-9B")
    assert ref.weights_bytes == 5_100_000_000
    assert ref.arch.native == 131072 and ref.arch.max_position_embeddings == 505_000  # YaRN ×4, the card's proportion
    # A bad cached config is ignored rather than trusted.
    store_records([replace(record, config={"model_type": "qwen3_5", "text_config": {"hidden_size": -3}})])
    assert catalog.resolve_model("Qwen3.5-9B").arch.native == 262144


def _write_mixed_safetensors(path: Path) -> int:
    """A real safetensors file with text, vision-tower and MTP tensors; returns the bytes mlx-lm would load."""
    import numpy as np
    from safetensors.numpy import save_file

    tensors = {
        "language_model.model.embed_tokens.weight": np.zeros((64, 32), dtype=np.float16),
        "language_model.model.layers.0.mlp.gate_proj.weight": np.zeros((32, 32), dtype=np.uint32),
        "vision_tower.blocks.0.attn.qkv.weight": np.zeros((96, 32), dtype=np.float16),
        "model.visual.merger.weight": np.zeros((16, 16), dtype=np.float32),
        "mtp.layers.0.weight": np.zeros((8, 32), dtype=np.float16),
    }
    save_file(tensors, str(path))
    return 64 * 32 * 2 + 32 * 32 * 4


def test_local_weights_count_only_what_mlx_lm_loads(tmp_path):
    config = json.loads((REFERENCE / "Qwen3.5-0.8B.config.json").read_text())
    folder = _write_folder(tmp_path / "vlm-build", config)
    text_bytes = _write_mixed_safetensors(folder / "model.safetensors")
    assert (folder / "model.safetensors").stat().st_size > text_bytes  # vision and MTP are on disk...
    assert catalog.resolve_model(str(folder)).weights_bytes == text_bytes  # ...but not in memory
