"""Finding, checking and loading model folders (macapp/core/engine/model_folder.py) on the tiny real models."""

from __future__ import annotations

import json
import shutil

import pytest

from macapp.core import events as ev
from macapp.core.engine import Engine, EngineError, check_model_folder, locate_model
from macapp.core.engine.model_folder import display_name
from macapp.core.events import Failed
from macapp.core.sampling import greedy
from tests.core.engine.helpers import ANSWER, REASONING, TIMEOUT


def test_load_reports_time_memory_and_model(engine, tiny_moe_path):
    info = engine.loaded
    assert info.model_type == "qwen3_5_moe" and info.name == tiny_moe_path.name
    assert 0 < info.load_time_s < 30
    assert info.weights_bytes > 1_000_000 and info.memory_bytes > 0
    assert info.bits is None and info.max_context == 262144 and info.has_thinking


def test_quantized_and_hub_layout_models_load_and_follow_the_script(tiny_moe_4bit_path, tiny_hub_layout_path):
    e = Engine()
    try:
        assert e.load(str(tiny_moe_4bit_path)).result(timeout=TIMEOUT).bits == 4
        assert e.new_session().send("hi", thinking=False, sampling=greedy(20)).result(timeout=TIMEOUT).text == ANSWER
        info = e.load(str(tiny_hub_layout_path)).result(timeout=TIMEOUT)
        assert info.bits is None and info.model_type == "qwen3_5_moe"
        reply = e.new_session().send("hi", thinking=True, sampling=greedy(30)).result(timeout=TIMEOUT)
        assert (reply.reasoning, reply.text) == (REASONING, ANSWER)
    finally:
        e.close()


def _load_failure(engine_, spec):
    job = engine_.load(str(spec))
    last = job.wait(TIMEOUT)
    assert isinstance(last, Failed), last
    return last


def test_bad_model_folders_are_refused_with_a_reason(tmp_path, tiny_moe_path, monkeypatch):
    e = Engine()
    try:
        missing = _load_failure(e, tmp_path / "nowhere")
        assert missing.code == ev.NOT_FOUND and "nowhere" in missing.message

        empty = tmp_path / "empty"
        empty.mkdir()
        assert _load_failure(e, empty).code == ev.NOT_A_MODEL

        llama = tmp_path / "llama"
        shutil.copytree(tiny_moe_path, llama)
        config = json.loads((llama / "config.json").read_text())
        config["model_type"] = "llama"
        config.pop("text_config")
        (llama / "config.json").write_text(json.dumps(config))
        refused = _load_failure(e, llama)
        assert refused.code == ev.NOT_A_MODEL and "llama" in refused.message

        broken = tmp_path / "broken"
        shutil.copytree(tiny_moe_path, broken)
        weights = broken / "model.safetensors"
        with open(weights, "r+b") as f:
            f.truncate(weights.stat().st_size // 2)
        corrupt = _load_failure(e, broken)
        assert corrupt.code == ev.CORRUPT and "download" in corrupt.message

        garbled = tmp_path / "garbled"
        shutil.copytree(tiny_moe_path, garbled)
        (garbled / "config.json").write_text("{not json")
        assert _load_failure(e, garbled).code == ev.CORRUPT

        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        absent = _load_failure(e, "mlx-community/Qwen3.5-0.8B-4bit")
        assert absent.code == ev.NOT_FOUND and "qwen-desk download" in absent.message
        by_name = _load_failure(e, "Qwen3.5-0.8B")  # a catalog name resolves to its 4-bit repo
        assert by_name.code == ev.NOT_FOUND and "mlx-community/Qwen3.5-0.8B-4bit" in by_name.message

        with pytest.raises(EngineError) as err:
            e.load(str(tmp_path / "nowhere")).result(timeout=TIMEOUT)
        assert err.value.code == ev.NOT_FOUND
    finally:
        e.close()


def test_a_refused_folder_keeps_the_loaded_model(tmp_path, tiny_moe_path):
    e = Engine()
    try:
        e.load(str(tiny_moe_path)).result(timeout=TIMEOUT)
        _load_failure(e, tmp_path / "nowhere")
        assert e.loaded is not None
        assert e.new_session().send("hi", thinking=False, sampling=greedy(20)).result(timeout=TIMEOUT).text == ANSWER
    finally:
        e.close()


def test_a_downloaded_repo_id_loads_from_the_hugging_face_cache(tiny_moe_path, monkeypatch, tmp_path):
    hub = tmp_path / "hf" / "hub"
    snapshot = hub / "models--acme--tiny-qwen" / "snapshots" / "0123abc"
    shutil.copytree(tiny_moe_path, snapshot)
    (hub / "models--acme--tiny-qwen" / "refs").mkdir()
    (hub / "models--acme--tiny-qwen" / "refs" / "main").write_text("0123abc")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    e = Engine()
    try:
        info = e.load("acme/tiny-qwen").result(timeout=TIMEOUT)
        assert info.name == "acme/tiny-qwen" and info.path == str(snapshot)
    finally:
        e.close()


def test_load_finds_and_checks_the_folder_once(tiny_moe_path, monkeypatch):
    from macapp.core.engine import model_folder

    calls = []
    for name in ("locate_model", "check_model_folder"):
        real = getattr(model_folder, name)
        monkeypatch.setattr(model_folder, name, lambda *a, real=real, name=name: (calls.append(name), real(*a))[1])
    e = Engine()
    try:
        assert e.load(str(tiny_moe_path)).result(timeout=TIMEOUT).name
    finally:
        e.close()
    assert sorted(calls) == ["check_model_folder", "locate_model"]


def test_the_folder_check_accepts_exactly_the_catalogs_model_types(tmp_path, tiny_moe_path):
    from macapp.core import catalog

    for model_type in [*sorted(catalog.SUPPORTED_MODEL_TYPES), "llama", "qwen3", None]:
        folder = tmp_path / f"type-{model_type}"
        shutil.copytree(tiny_moe_path, folder)
        config = json.loads((folder / "config.json").read_text())
        config.pop("model_type")
        config["text_config"]["model_type"] = model_type  # only the nested config says it: read from there too
        (folder / "config.json").write_text(json.dumps(config))
        if model_type in catalog.SUPPORTED_MODEL_TYPES:
            assert check_model_folder(folder)["text_config"]["model_type"] == model_type
        else:
            with pytest.raises(EngineError) as err:
                check_model_folder(folder)
            assert err.value.code == ev.NOT_A_MODEL and repr(model_type) in err.value.message


def test_a_repo_id_by_the_catalogs_pattern_is_looked_up_in_the_cache_not_the_catalog(monkeypatch):
    from macapp.core import catalog

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for spec in ("acme/Model-1.5.x", "some_org/a.b-c"):
        assert catalog.REPO_ID.match(spec)
        with pytest.raises(EngineError) as err:
            locate_model(spec)
        assert err.value.code == ev.NOT_FOUND and f"qwen-desk download {spec}" in err.value.message
    with pytest.raises(EngineError) as err:  # not a repo id: the catalog is asked, and does not know it
        locate_model("no-such-model-anywhere")
    assert "not a known model name" in err.value.message


def test_the_model_is_named_by_its_folder_or_its_hub_repo(tmp_path):
    assert display_name(tmp_path / "My-Model") == "My-Model"
    assert display_name(tmp_path / "models--acme--tiny-qwen" / "snapshots" / "0123abc") == "acme/tiny-qwen"
