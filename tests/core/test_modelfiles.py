"""Reading model files without loading them (macapp/core/modelfiles.py): text_config and safetensors headers."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest

from macapp.core.modelfiles import SafetensorsError, read_safetensors_header, safetensors_problem, text_config


def test_text_config_is_the_nested_one_or_the_top_level():
    nested = {"model_type": "qwen3_5_moe", "text_config": {"model_type": "qwen3_5_moe_text", "hidden_size": 64}}
    assert text_config(nested) == {"model_type": "qwen3_5_moe_text", "hidden_size": 64}
    flat = {"model_type": "qwen3_5", "hidden_size": 32}
    assert text_config(flat) is flat
    assert text_config({"hidden_size": 1, "text_config": "not a dict"})["hidden_size"] == 1


@pytest.fixture
def weights(tmp_path):
    path = tmp_path / "model.safetensors"
    mx.save_safetensors(str(path), {"a": mx.zeros((4, 8)), "b.weight": mx.ones((3,), dtype=mx.float16)}, metadata={"format": "mlx"})
    return path


def test_the_header_gives_every_tensors_offsets_and_the_metadata(weights):
    header = read_safetensors_header(weights)
    assert set(header.tensors) == {"a", "b.weight"}
    sizes = sorted(end - start for start, end in header.tensors.values())
    assert sizes == [3 * 2, 4 * 8 * 4]
    assert header.metadata == {"format": "mlx"}
    assert header.header_bytes + header.data_bytes == weights.stat().st_size
    assert safetensors_problem(weights) is None


def _with_header(path, header: bytes, length: int | None = None, tail: bytes = b""):
    n = len(header) if length is None else length
    path.write_bytes(n.to_bytes(8, "little") + header + tail)
    return path


@pytest.mark.parametrize(
    "make, problem",
    [
        (lambda p: p.write_bytes(b"\x01\x02") and p, "too short"),
        (lambda p: _with_header(p, b"{}", length=0), "bad header length"),
        (lambda p: _with_header(p, b"{}", length=10_000), "bad header length"),
        (lambda p: _with_header(p, b"{not json"), "unreadable header"),
        (lambda p: _with_header(p, b"[1, 2]"), "bad header"),
        (lambda p: _with_header(p, json.dumps({"x": {"dtype": "F32"}}).encode()), "bad entry for x"),
        (lambda p: _with_header(p, json.dumps({"x": {"data_offsets": [0, 64]}}).encode(), tail=b"\0" * 10), "truncated"),
    ],
)
def test_a_broken_file_says_what_is_wrong(tmp_path, make, problem):
    path = make(tmp_path / "model.safetensors")
    assert problem in safetensors_problem(path)
    if problem != "truncated":  # the header itself is readable when only the data is short
        with pytest.raises(SafetensorsError):
            read_safetensors_header(path)


def test_a_truncated_real_file_is_caught(weights):
    whole = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(whole - 1)
    assert safetensors_problem(weights) == f"truncated: {whole - 1:,} bytes of {whole:,}"
    assert "unreadable header" in safetensors_problem(weights.with_name("missing.safetensors"))
