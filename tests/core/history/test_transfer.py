"""Export to Markdown and JSON, import from JSON: a stable format that round-trips every field."""

from __future__ import annotations

import json

import pytest

from macapp.core.history import EXPORT_FORMAT, ImportFormatError, Store, iso_time
from macapp.core.history.transfer import parse_time


def test_export_markdown_with_and_without_reasoning(store, sourdough):
    cid = sourdough(store)
    md = store.export_markdown(cid, include_reasoning=True)
    assert md.startswith("# How do I bake sourdough bread at home?\n")
    assert "## User\n\nHow do I bake sourdough bread at home?" in md
    assert "## Assistant" in md and "The user wants a recipe." in md
    assert "## System\n\nYou are concise." in md
    assert "generation 24 tokens at 35.5 tok/s" in md
    bare = store.export_markdown(cid, include_reasoning=False)
    assert "The user wants a recipe." not in bare and "proof overnight" in bare


def test_markdown_notes_a_stopped_reply_and_another_model(store):
    conv = store.create_conversation("Qwen3.5-9B")
    store.add_message(conv.id, "user", "q")
    store.add_message(conv.id, "assistant", "", state="stopped", finish_reason="interrupted", model="Qwen3.5-4B")
    store.add_message(conv.id, "user", "again")
    store.add_message(conv.id, "assistant", "An answer.", finish_reason="stop", model="Qwen3.5-9B")  # the model switched back
    md = store.export_markdown(conv.id)
    assert "*(no answer)*" in md and "*Qwen3.5-4B · stopped (interrupted)*" in md
    assert "Qwen3.5-9B ·" not in md  # the conversation's own model is not noted on its replies


@pytest.mark.parametrize("include_reasoning", [True, False])
def test_export_json_and_import_round_trip(store, sourdough, include_reasoning):
    cid = sourdough(store)
    text = store.export_json(cid, include_reasoning=include_reasoning)
    doc = json.loads(text)
    assert doc["format"] == EXPORT_FORMAT and doc == store.export_dict(cid, include_reasoning)
    assert doc["id"] == cid and doc["title"].startswith("How do I bake")
    assert [(m["role"], m["content"][:5]) for m in doc["messages"]] == [("user", "How d"), ("assistant", "Mix f")]
    assert doc["messages"][1]["reasoning"] == ("The user wants a recipe." if include_reasoning else None)
    assert doc["messages"][1]["stats"]["generation_tokens"] == 24

    new_id = store.import_json(text)
    assert new_id != cid
    original, imported = store.get_conversation(cid), store.get_conversation(new_id)
    assert (imported.title, imported.model, imported.system_prompt, imported.settings) == (
        original.title,
        original.model,
        original.system_prompt,
        original.settings,
    )
    assert abs(imported.created - original.created) < 1
    for a, b in zip(original.messages, imported.messages, strict=True):
        assert (a.role, a.content, a.thinking, a.state, a.finish_reason, a.stats, a.model) == (
            b.role,
            b.content,
            b.thinking,
            b.state,
            b.finish_reason,
            b.stats,
            b.model,
        )
        assert b.reasoning == (a.reasoning if include_reasoning else "")
    # The import's own export matches (modulo ids): the format is stable.
    again = json.loads(store.export_json(new_id, include_reasoning=include_reasoning))
    assert again["messages"] == doc["messages"]


def test_import_minimal_and_bad_documents(store):
    new_id = store.import_json({"messages": [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"}]})
    conv = store.get_conversation(new_id)
    assert conv.title == "hi there" and [m.content for m in conv.messages] == ["hi there", "hello"]
    for bad, why in [
        ("not json", "Not JSON"),
        ("[1, 2]", "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "Message 1"),
        ({"format": "other.app", "messages": []}, "Unknown format"),
    ]:
        with pytest.raises(ImportFormatError, match=why):
            store.import_json(bad)
    assert len(store.list_conversations()) == 1  # a failed import adds nothing


def test_an_imported_streaming_reply_is_stopped(store):
    new_id = store.import_json({"messages": [{"role": "assistant", "content": "cut", "state": "streaming"}]})
    assert store.get_conversation(new_id).messages[0].state == "stopped"


@pytest.mark.parametrize(
    "value, expected",
    [(1000, 1000.0), ("1970-01-01T00:16:40Z", 1000.0), ("1970-01-01T00:16:40", 1000.0), ("yesterday", -1.0), (True, -1.0), (None, -1.0)],
)
def test_times_read_from_seconds_or_iso(value, expected):
    assert parse_time(value, -1.0) == expected
    assert iso_time(1000.0) == "1970-01-01T00:16:40Z"


def test_export_of_everything_survives_json(tmp_path):
    """Unicode, newlines and quotes in every field come back unchanged through export/import."""
    with Store.open(tmp_path / "h.sqlite3") as s:
        conv = s.create_conversation("Qwen3.5-0.8B", 'say "hi"\nnicely', {"stop": ["</s>"], "темп": 0.1})
        s.add_message(conv.id, "user", 'naïve 你好 "quoted"\n\nsecond paragraph')
        s.add_message(conv.id, "assistant", "```py\nprint('x')\n```", reasoning="<think>-ish 🙂")
        doc = json.loads(s.export_json(conv.id))
        new = s.get_conversation(s.import_json(doc))
        old = s.get_conversation(conv.id)
        assert [(m.content, m.reasoning) for m in new.messages] == [(m.content, m.reasoning) for m in old.messages]
        assert (new.system_prompt, new.settings) == (old.system_prompt, old.settings)
