"""Catalog rows refreshed from the hub (the local stand-in, spoken to by the real huggingface_hub client)."""

import json
from pathlib import Path

import pytest

from macapp.core import catalog
from macapp.core.catalog import ConfigError, UnknownModel

RECORDED = Path(__file__).parent / "recorded"


def published_build(bits: int) -> dict[str, bytes]:
    config = json.loads((RECORDED / "Qwen3.5-0.8B.config.json").read_text())
    config["quantization"] = {"group_size": 64, "bits": bits}
    return {
        "config.json": json.dumps(config).encode(),
        "model.safetensors": b"\0" * 1_234_567,
        "tokenizer.json": b"{}",
        "README.md": b"# card",
    }


def test_refresh_reads_real_config_and_exact_sizes(hub_server):
    hub_server.add_repo("mlx-community/Qwen3.5-0.8B-4bit", published_build(4))
    entries = [e for e in catalog.builtin_catalog() if e.name == "Qwen3.5-0.8B"]
    errors = catalog.refresh_catalog(entries)
    assert errors == {"mlx-community/Qwen3.5-0.8B-8bit": errors["mlx-community/Qwen3.5-0.8B-8bit"]}  # not served: reported
    assert "NotFound" in errors["mlx-community/Qwen3.5-0.8B-8bit"]
    ref = catalog.resolve_model("Qwen3.5-0.8B", 4)
    assert ref.weights_bytes == 1_234_567
    assert catalog.resolve_model("Qwen3.5-0.8B", 8).weights_bytes is None  # still the built-in row
    # Offline afterwards: the cached refresh is still used.
    hub_server.stop()
    assert catalog.resolve_model("Qwen3.5-0.8B", 4).weights_bytes == 1_234_567


def test_refresh_offline_keeps_builtin(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "*" in catalog.refresh_catalog()
    assert catalog.resolve_model("Qwen3.5-0.8B").weights_bytes is None


def test_any_hub_repo_resolves_from_its_config(hub_server):
    hub_server.add_repo("someone/Qwen3.5-0.8B-finetune-8bit", published_build(8))
    ref = catalog.resolve_model("someone/Qwen3.5-0.8B-finetune-8bit")
    assert ref.origin == "hub" and ref.bits == 8 and ref.weights_bytes == 1_234_567
    assert ref.arch.hidden_size == 1024


def test_hub_errors_are_actionable(hub_server):
    with pytest.raises(UnknownModel, match="does not exist"):
        catalog.resolve_model("nobody/no-such-model")
    hub_server.add_repo("org/gated-qwen", published_build(4), gated=True)
    with pytest.raises(UnknownModel, match="HF_TOKEN"):
        catalog.resolve_model("org/gated-qwen")
    files = published_build(4)
    files["config.json"] = json.dumps({"model_type": "llama", "hidden_size": 4096}).encode()
    hub_server.add_repo("org/not-qwen", files)
    with pytest.raises(ConfigError, match="not a Qwen3.5 model"):
        catalog.resolve_model("org/not-qwen")
    hub_server.stop()
    with pytest.raises(UnknownModel, match="cannot be reached"):
        catalog.resolve_model("org/unreachable")


def test_hub_weights_leave_out_vision_tensors_read_from_the_headers(hub_server, tmp_path):
    from tests.core.test_catalog import _write_mixed_safetensors

    text_bytes = _write_mixed_safetensors(tmp_path / "model.safetensors")
    files = published_build(4)
    files["model.safetensors"] = (tmp_path / "model.safetensors").read_bytes()
    hub_server.add_repo("someone/qwen3.5-vlm-4bit", files)
    ref = catalog.resolve_model("someone/qwen3.5-vlm-4bit")
    assert ref.weights_bytes == text_bytes < len(files["model.safetensors"])
