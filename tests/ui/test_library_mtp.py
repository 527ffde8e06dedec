"""The details pane says where a build's MTP head comes from, from local files and cached hub records only."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx

from macapp.core.hub.mtp import SIDE_FILE_MARK
from macapp.core.hub.record import HubFile, HubModelRecord, HubTensor, store_records
from macapp.core.modelfiles import mtp_side_file
from macapp.core.tensor_roles import TensorRole

RECORDED = Path(__file__).parents[1] / "core" / "recorded"


def _with_head_in_build(source: Path, folder: Path) -> Path:
    shutil.copytree(source, folder)
    weights = mx.load(str(folder / "model.safetensors"))
    weights["mtp.fc.weight"] = mx.zeros((64, 128))
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    return folder


def _with_side_file(source: Path, folder: Path) -> Path:
    shutil.copytree(source, folder)
    mx.save_safetensors(str(mtp_side_file(folder)), {"mtp.norm.weight": mx.ones((64,))}, metadata={SIDE_FILE_MARK: "Qwen/x"})
    return folder


def _records(build: str, source: str) -> int:
    config = json.loads((RECORDED / "Qwen3.5-0.8B.config.json").read_text())
    config["quantization"] = {"bits": 4, "group_size": 64}
    language = HubTensor("language_model.model.norm.weight", "model.safetensors", "BF16", (1024,), 100, 2148, TensorRole.LANGUAGE)
    head = [
        HubTensor("mtp.fc.weight", "model-00002.safetensors", "BF16", (1024, 2048), 0, 4_194_304, TensorRole.MTP),
        HubTensor("mtp.norm.weight", "model-00002.safetensors", "BF16", (1024,), 4_194_304, 4_196_352, TensorRole.MTP),
    ]
    store_records(
        [
            HubModelRecord(build, "a" * 40, config, (HubFile("model.safetensors", 2148, "e1"),), (language,)),
            HubModelRecord(source, "b" * 40, config, (HubFile("model-00002.safetensors", 4_196_352, "e2"),), tuple(head)),
        ]
    )
    return sum(t.nbytes for t in head)


def test_the_details_say_available_to_fetch_none_or_not_known(library, tiny_dense_path, tmp_path, hub_server):
    hub_server.reset_log()
    library.open_local_folder(str(tiny_dense_path))
    assert library.details.mtp.text().startswith("Faster replies: not known yet")  # no card, no record: the original is unknown
    library.open_local_folder(str(_with_head_in_build(tiny_dense_path, tmp_path / "with-head")))
    assert library.details.mtp.text().startswith("Faster replies: yes (a ") and "part in the build" in library.details.mtp.text()
    library.open_local_folder(str(_with_side_file(tiny_dense_path, tmp_path / "with-side-file")))
    assert "part fetched beside the build" in library.details.mtp.text()

    build, source = "mlx-community/Qwen3.5-0.8B-4bit", "Qwen/Qwen3.5-0.8B"
    fetch = _records(build, source)
    library.refresh()
    library.select(build)
    text = library.details.mtp.text()
    assert fetch == 4_196_352 and text.startswith(f"Faster replies: possible with a 4.2 MB part to fetch from {source}"), text
    assert f"qwen-desk download {build} --mtp" in text
    store_records([HubModelRecord(source, "c" * 40, {}, (), (HubTensor("model.norm.weight", "m", "BF16", (8,), 0, 16, TensorRole.LANGUAGE),))])
    library.refresh()
    library.select(build)
    assert library.details.mtp.text().startswith("Faster replies: not for this build")  # the original has no mtp.* tensors
    assert hub_server.log == []  # all of it from files and cached records: the GUI thread never asked the hub
