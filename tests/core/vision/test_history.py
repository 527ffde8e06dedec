"""Pictures in the history: stored once in the app's pictures folder, referenced from their message, back with a
reopened conversation, through delete/undo, and inside exported / imported conversations."""

from __future__ import annotations

import json

import pytest

from macapp.core import paths
from macapp.core.history import Store
from macapp.core.history.errors import ImportFormatError
from macapp.core.recorder import ChatRecorder
from macapp.core.events import TurnKind
from macapp.core.vision.images import open_image
from macapp.core.vision.pictures import FILES, load_picture, save_picture


def _conversation_with_pictures(store, picture):
    a = open_image(picture("cat.png", (80, 60)))
    b = open_image(picture("dog.jpg", (40, 40), "JPEG", seed=3))
    recorder = ChatRecorder(store, model="tiny")
    recorder.begin(TurnKind.SEND, "what are these?", thinking=False, images=(a, b))
    store.add_message(recorder.conversation_id, "assistant", "two animals")
    return recorder.conversation_id, (a, b)


def test_a_sent_picture_is_stored_once_and_referenced(picture):
    with Store.open(pictures=FILES) as store:
        conv_id, (a, b) = _conversation_with_pictures(store, picture)
        message = store.get_conversation(conv_id).messages[0]
    assert [r.name for r in message.images] == ["cat.png", "dog.jpg"]
    assert [(r.width, r.height) for r in message.images] == [(80, 60), (40, 40)]
    files = sorted(paths.pictures_dir().glob("*.png"))
    assert [f.name for f in files] == sorted(r.file_name for r in message.images)
    assert save_picture(a) == message.images[0] and len(list(paths.pictures_dir().glob("*.png"))) == 2  # same picture, same file


def test_a_reopened_conversation_gets_the_same_pixels(picture):
    with Store.open(pictures=FILES) as store:
        conv_id, (a, b) = _conversation_with_pictures(store, picture)
        messages = store.get_conversation(conv_id).chat_messages()
    pictures = messages[0]["images"]
    assert [p.image.tobytes() for p in pictures] == [a.image.tobytes(), b.image.tobytes()]
    assert "images" not in messages[1]


def test_a_missing_picture_file_leaves_the_text(picture):
    with Store.open(pictures=FILES) as store:
        conv_id, _ = _conversation_with_pictures(store, picture)
        ref = store.get_conversation(conv_id).messages[0].images[0]
        (paths.pictures_dir() / ref.file_name).unlink()
        messages = store.get_conversation(conv_id).chat_messages()
    assert messages[0]["content"] == "what are these?" and [p.name for p in messages[0]["images"]] == ["dog.jpg"]


def test_delete_and_undo_keep_the_pictures(picture):
    with Store.open(pictures=FILES) as store:
        conv_id, _ = _conversation_with_pictures(store, picture)
        snapshot = store.delete(conv_id)
        store.restore(snapshot)
        assert len(store.get_conversation(conv_id).messages[0].images) == 2


def test_export_carries_the_pictures_and_import_brings_them_back(picture, tmp_path, monkeypatch):
    with Store.open(pictures=FILES) as store:
        conv_id, (a, _) = _conversation_with_pictures(store, picture)
        document = store.export_json(conv_id)
        markdown = store.export_markdown(conv_id)
    exported = json.loads(document)["messages"][0]["images"]
    assert [p["name"] for p in exported] == ["cat.png", "dog.jpg"] and exported[0]["data_url"].startswith("data:image/png;base64,")
    assert "[picture: cat.png, 80x60]" in markdown
    monkeypatch.setenv("QWEN_DESK_HOME", str(tmp_path / "another-mac"))  # empty pictures folder, empty history
    with Store.open(pictures=FILES) as store:
        new_id = store.import_json(document)
        message = store.get_conversation(new_id).messages[0]
        pictures = store.get_conversation(new_id).chat_messages()[0]["images"]
    assert [r.name for r in message.images] == ["cat.png", "dog.jpg"]
    assert pictures[0].image.tobytes() == a.image.tobytes()
    assert load_picture(message.images[1]).size == (40, 40)


def test_import_refuses_a_bad_picture_by_message(tmp_path):
    document = {"messages": [{"role": "user", "content": "hi", "images": [{"name": "x.png", "data_url": "data:image/png;base64,bm90IGEgcG5n"}]}]}
    with Store.open(pictures=FILES) as store:
        with pytest.raises(ImportFormatError, match=r"Message 1: x\.png: is not a picture"):
            store.import_json(document)
        assert store.list_conversations() == []
    remote = {"messages": [{"role": "user", "content": "hi", "images": [{"name": "y", "data_url": "https://example.com/y.png"}]}]}
    with Store.open(pictures=FILES) as store, pytest.raises(ImportFormatError, match="not fetched"):
        store.import_json(remote)


def test_a_store_opened_without_picture_files_reopens_the_text_and_refuses_to_import_a_picture(picture):
    with Store.open(pictures=FILES) as store:
        conv_id, _ = _conversation_with_pictures(store, picture)
        document = store.export_json(conv_id)
    with Store.open() as store:
        messages = store.get_conversation(conv_id).chat_messages()
        assert messages[0]["content"] == "what are these?" and "images" not in messages[0]
        with pytest.raises(ImportFormatError, match=r"Message 1: cat\.png: this history was opened without a way to store pictures"):
            store.import_json(document)
