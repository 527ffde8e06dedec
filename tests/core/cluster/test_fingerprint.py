"""The model-files check between hosts: a fingerprint of config, index and safetensors headers."""

import json
import shutil

import pytest

from macapp.core.cluster.fingerprint import fingerprint, main
from macapp.core.cluster.launch import ClusterError, compare_fingerprints


def test_same_files_same_fingerprint_and_a_copy_matches(tiny_moe_path, tmp_path):
    copy = shutil.copytree(tiny_moe_path, tmp_path / "copy")
    a, b = fingerprint(tiny_moe_path), fingerprint(copy)
    assert a == b and a.digest == b.digest
    assert {"config.json", "model.safetensors.index.json", "model.safetensors"} <= set(a.files)
    compare_fingerprints({"this Mac": a, "mac-b": b})  # no error


def test_another_build_or_a_truncated_download_is_named(tiny_moe_path, tiny_moe_4bit_path, tmp_path):
    other = fingerprint(tiny_moe_4bit_path)
    with pytest.raises(ClusterError) as exc:
        compare_fingerprints({"this Mac": fingerprint(tiny_moe_path), "mac-b": other})
    assert "mac-b differs from this Mac in config.json" in str(exc.value) and "Download the same build" in str(exc.value)
    cut = shutil.copytree(tiny_moe_path, tmp_path / "cut")
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    assert fingerprint(tiny_moe_path).differences(fingerprint(cut)) == ["model.safetensors"]


def test_the_command_run_over_ssh_prints_json(tiny_dense_path, capsys, tmp_path):
    assert main([str(tiny_dense_path)]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["files"] == fingerprint(tiny_dense_path).files
    assert main([str(tmp_path / "missing")]) == 1
    assert "No model folder" in json.loads(capsys.readouterr().out)["error"]
