"""The history store on real SQLite files: schema, streaming writes, search, export/import, undo."""

from __future__ import annotations

import json
import sqlite3
import threading
import time

import pytest

from macapp.core import paths, store as store_module
from macapp.core.store import (
    SCHEMA_VERSION,
    ImportFormatError,
    NotFoundError,
    ReplyStats,
    Store,
    StoreError,
    title_from_text,
)


@pytest.fixture
def db(tmp_path):
    with Store.open(tmp_path / "history.sqlite3") as s:
        yield s


def _conversation(s: Store, first="How do I bake sourdough bread at home?", reasoning="The user wants a recipe."):
    conv = s.create_conversation("Qwen3.5-0.8B", "You are concise.", {"temperature": 0.6, "thinking": True})
    s.add_message(conv.id, "user", first)
    writer = s.begin_reply(conv.id, thinking=True, model="Qwen3.5-0.8B")
    writer.append(reasoning=reasoning)
    writer.append("Mix flour, water, salt and starter; ")
    writer.append("proof overnight, bake at 250 °C.")
    writer.finish(
        {"ttft_s": 0.31, "prompt_tokens": 40, "prompt_tps": 400.0, "generation_tokens": 24, "generation_tps": 35.5,
         "reasoning_tokens": 6, "peak_memory_bytes": 2_100_000_000},
        "stop",
    )
    return conv.id


def test_default_location_is_the_app_home_and_wal(_isolated_home):
    with Store.open() as s:
        assert s.path == paths.db_path() == _isolated_home / "history.sqlite3"
        assert s._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert s._conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 1000
        assert s.schema_version == SCHEMA_VERSION
        assert s.notice is None and not s.read_only


def test_conversation_round_trip_with_stats_and_title(db):
    cid = _conversation(db)
    conv = db.get_conversation(cid)
    assert conv.title == "How do I bake sourdough bread at home?"
    assert conv.system_prompt == "You are concise."
    assert conv.settings == {"temperature": 0.6, "thinking": True}
    assert [m.role for m in conv.messages] == ["user", "assistant"]
    assert [m.position for m in conv.messages] == [0, 1]
    reply = conv.messages[1]
    assert reply.content == "Mix flour, water, salt and starter; proof overnight, bake at 250 °C."
    assert reply.reasoning == "The user wants a recipe."
    assert reply.thinking is True and reply.state == "complete" and reply.finish_reason == "stop"
    assert reply.model == "Qwen3.5-0.8B"
    assert reply.stats == ReplyStats(0.31, 40, 400.0, 24, 35.5, 6, 2_100_000_000)
    assert conv.chat_messages()[0] == {"role": "system", "content": "You are concise."}
    assert [c.id for c in db.list_conversations()] == [cid]
    assert db.list_conversations()[0].message_count == 2


def test_stats_come_from_the_engine_and_read_like_the_chat_command_line():
    from macapp.core.events import GenerationStats, format_stats

    engine_stats = GenerationStats(ttft_s=0.31, prompt_tokens=10, prompt_tps=100.0, generation_tokens=5, generation_tps=20.0,
                                   reasoning_tokens=2, peak_memory_bytes=1_500_000_000, context_tokens=532)
    stats = ReplyStats.from_any(engine_stats)
    assert stats == ReplyStats(0.31, 10, 100.0, 5, 20.0, 2, 1_500_000_000)
    assert stats.summary() == (
        "prompt 10 tokens at 100.0 tok/s · generation 5 tokens at 20.0 tok/s · 2 reasoning · first token 0.31 s · peak 1.50 GB"
    )
    assert format_stats(engine_stats) == stats.summary() + " · context 532"  # one formatter for the CLI and the history
    assert ReplyStats.from_any({"generation_tokens": 3}).summary() == "generation 3 tokens"


@pytest.mark.parametrize(
    "text, title",
    [
        ("  Hello   world \n second line", "Hello world"),
        ("\n\n```python\nprint(1)\n```\nWhy does this fail?", "print(1)"),
        ("# Plan a trip to Kyoto", "Plan a trip to Kyoto"),
        ("word " * 40, ("word " * 11).strip() + "…"),
        ("x" * 100, "x" * 59 + "…"),
        ("   ", ""),
    ],
)
def test_titles_from_the_first_message(text, title):
    result = title_from_text(text)
    assert result == title
    assert len(result) <= 60 and "\n" not in result


def test_only_the_first_user_message_titles_and_rename_wins(db):
    conv = db.create_conversation("m")
    assert db.get_conversation(conv.id).title == ""
    db.add_message(conv.id, "user", "First question")
    db.add_message(conv.id, "user", "Second question")
    assert db.get_conversation(conv.id).title == "First question"
    db.rename(conv.id, "  My   bread notes ")
    db.add_message(conv.id, "user", "Third")
    assert db.get_conversation(conv.id).title == "My bread notes"
    with pytest.raises(NotFoundError):
        db.rename(999, "x")


def test_list_is_newest_activity_first(db):
    a = db.create_conversation("m")
    b = db.create_conversation("m")
    db.add_message(a.id, "user", "later activity")
    assert [c.id for c in db.list_conversations()] == [a.id, b.id]
    assert [c.id for c in db.list_conversations(limit=1)] == [a.id]


def test_bad_role_or_unknown_conversation_is_refused(db):
    conv = db.create_conversation("m")
    with pytest.raises(StoreError, match="role"):
        db.add_message(conv.id, "tool", "x")
    with pytest.raises(NotFoundError, match="no conversation 4242"):
        db.add_message(4242, "user", "x")
    with pytest.raises(NotFoundError):
        db.get_conversation(4242)


# ---------------------------------------------------------------- streaming writer


def _committed(path, message_id):
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT content, reasoning, state FROM messages WHERE id = ?", (message_id,)).fetchone()
    finally:
        conn.close()


def test_reply_commits_are_throttled_but_never_stale_for_long(db):
    conv = db.create_conversation("m")
    db.add_message(conv.id, "user", "q")
    writer = db.begin_reply(conv.id, interval=0.4)
    assert _committed(db.path, writer.message_id) == ("", "", "streaming")  # the row exists before any token
    start = time.monotonic()
    while time.monotonic() - start < 1.0:
        writer.append("tok ")
        time.sleep(0.005)
    # ~100 appends in 1 s, committed at most every 0.4 s (the first commit may come at once).
    assert 2 <= writer.commits <= 4
    # A stalled stream still reaches the disk within the interval.
    writer.append("LAST")
    time.sleep(0.9)
    content, _, state = _committed(db.path, writer.message_id)
    assert content.endswith("tok LAST") and state == "streaming"
    message = writer.finish(None, "length", stopped=True)
    assert message.state == "stopped"
    assert _committed(db.path, writer.message_id)[2] == "stopped"
    with pytest.raises(StoreError, match="already finished"):
        writer.append("more")


def test_update_replaces_the_text_so_far(db):
    conv = db.create_conversation("m")
    writer = db.begin_reply(conv.id, interval=0)
    writer.update("draft", "thinking")
    writer.update("final answer")
    assert _committed(db.path, writer.message_id)[:2] == ("final answer", "thinking")
    writer.finish()
    assert db.get_conversation(conv.id).messages[0].state == "complete"


def test_writer_survives_its_conversation_being_deleted(db):
    conv = db.create_conversation("m")
    writer = db.begin_reply(conv.id, interval=0)
    db.delete(conv.id)
    writer.append("orphan text")
    writer.finish()
    assert writer.error is None
    assert db.list_conversations() == []


def test_interrupted_replies_are_marked_stopped(db):
    conv = db.create_conversation("m")
    writer = db.begin_reply(conv.id, interval=0)
    writer.append("half an ans")
    assert db.recover_interrupted() == 0  # still fresh: may be a live writer in another process
    assert db.recover_interrupted(older_than_s=-1) == 1
    reply = db.get_conversation(conv.id).messages[0]
    assert (reply.state, reply.finish_reason, reply.content) == ("stopped", "interrupted", "half an ans")


def test_truncate_for_regenerate(db):
    cid = _conversation(db)
    removed = db.truncate(cid, 1)
    assert [m.role for m in removed] == ["assistant"]
    assert [m.role for m in db.get_conversation(cid).messages] == ["user"]
    db.add_message(cid, "assistant", "another take")
    assert [m.position for m in db.get_conversation(cid).messages] == [0, 1]


def test_concurrent_reads_from_another_connection_while_streaming(tmp_path):
    path = tmp_path / "history.sqlite3"
    writer_store = Store.open(path)
    conv = writer_store.create_conversation("m")
    writer_store.add_message(conv.id, "user", "tell me a long story")
    writer = writer_store.begin_reply(conv.id, interval=0)
    stop = threading.Event()
    seen: list[list[int]] = [[], []]
    errors: list[BaseException] = []

    def reader(lengths: list[int]):
        try:
            with Store.open(path, busy_timeout_s=2) as other:
                while not stop.is_set():
                    messages = other.get_conversation(conv.id).messages
                    assert messages[0].content == "tell me a long story"
                    lengths.append(len(messages[1].content))
                    other.list_conversations()
                    other.search("story")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(lengths,)) for lengths in seen]
    for t in threads:
        t.start()
    for i in range(300):
        writer.append(f"w{i} ")
        if i % 50 == 0:
            time.sleep(0.01)
    writer.finish(None, "stop")
    time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(10)
    writer_store.close()
    assert not errors, errors
    for lengths in seen:
        assert len(lengths) > 5
        assert lengths == sorted(lengths)  # each reader sees a consistent, growing prefix
    with Store.open(path) as s:
        assert s.get_conversation(conv.id).messages[1].content == "".join(f"w{i} " for i in range(300))


# ---------------------------------------------------------------- search


def test_search_substring_case_and_terms(db):
    cid = _conversation(db)
    other = db.create_conversation("m")
    db.add_message(other.id, "user", "今天天气怎么样？ Weather in Tokyo")
    db.add_message(other.id, "assistant", "100% sunny_day", reasoning="look up forecast")
    assert db.search_uses_index == store_module.fts5_available()

    assert [(h.conversation_id, h.role) for h in db.search("SOURDOUGH")] == [(cid, "user")]
    assert [h.role for h in db.search("flour overnight")] == ["assistant"]  # all terms, any order
    assert db.search("flour tokyo") == []
    assert [h.role for h in db.search('"bake at 250"')] == ["assistant"]  # a phrase
    assert [h.role for h in db.search("recipe")] == ["assistant"]  # reasoning is searched too
    assert [h.conversation_id for h in db.search("天气")] == [other.id]  # two CJK characters: scan
    assert [h.conversation_id for h in db.search("今天天气")] == [other.id]  # four: index
    assert [h.role for h in db.search("100%")] == ["assistant"]
    assert [h.role for h in db.search("sunny_")] == ["assistant"]
    assert db.search("'\"") == [] and db.search("   ") == []
    hit = db.search("overnight")[0]
    assert "overnight" in hit.snippet and hit.conversation_title.startswith("How do I bake")
    db.delete(cid)
    assert db.search("sourdough") == []


def test_search_without_fts5_falls_back_and_index_is_rebuilt_later(tmp_path, monkeypatch):
    path = tmp_path / "history.sqlite3"
    with Store.open(path) as s:
        _conversation(s)
    monkeypatch.setattr(store_module, "_fts5_cache", False)  # a SQLite built without FTS5
    with Store.open(path) as s:
        assert not s.search_uses_index
        conv = s.create_conversation("m")
        s.add_message(conv.id, "user", "written while the index was off: marmalade")
        assert len(s.search("marmalade")) == 1 and len(s.search("sourdough")) == 1
    monkeypatch.setattr(store_module, "_fts5_cache", None)
    if not store_module.fts5_available():
        return  # nothing more to check on a SQLite without FTS5
    with Store.open(path) as s:
        assert s.search_uses_index
        assert len(s.search("marmalade")) == 1 and len(s.search("sourdough")) == 1
        s._conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")  # raises if stale


# ---------------------------------------------------------------- delete and undo


def test_delete_and_undo_keeps_ids(db):
    cid = _conversation(db)
    before = db.get_conversation(cid)
    snapshot = db.delete(cid)
    assert db.list_conversations() == []
    with pytest.raises(NotFoundError):
        db.get_conversation(cid)
    newer = db.create_conversation("m")
    assert newer.id != cid  # ids are never reused, so undo can put it back where it was
    assert db.restore(snapshot) == cid
    after = db.get_conversation(cid)
    assert after.messages == before.messages and after.title == before.title
    assert db.search("sourdough")[0].conversation_id == cid


# ---------------------------------------------------------------- export / import


def test_export_markdown_with_and_without_reasoning(db):
    cid = _conversation(db)
    md = db.export_markdown(cid, include_reasoning=True)
    assert md.startswith("# How do I bake sourdough bread at home?\n")
    assert "## User\n\nHow do I bake sourdough bread at home?" in md
    assert "## Assistant" in md and "The user wants a recipe." in md
    assert "## System\n\nYou are concise." in md
    assert "generation 24 tokens at 35.5 tok/s" in md
    bare = db.export_markdown(cid, include_reasoning=False)
    assert "The user wants a recipe." not in bare and "proof overnight" in bare


@pytest.mark.parametrize("include_reasoning", [True, False])
def test_export_json_and_import_round_trip(db, include_reasoning):
    cid = _conversation(db)
    text = db.export_json(cid, include_reasoning=include_reasoning)
    doc = json.loads(text)
    assert doc["id"] == cid and doc["title"].startswith("How do I bake")
    assert [(m["role"], m["content"][:5]) for m in doc["messages"]] == [("user", "How d"), ("assistant", "Mix f")]
    assert doc["messages"][1]["reasoning"] == ("The user wants a recipe." if include_reasoning else None)
    assert doc["messages"][1]["stats"]["generation_tokens"] == 24

    new_id = db.import_json(text)
    assert new_id != cid
    original, imported = db.get_conversation(cid), db.get_conversation(new_id)
    assert (imported.title, imported.model, imported.system_prompt, imported.settings) == (
        original.title, original.model, original.system_prompt, original.settings)
    assert abs(imported.created - original.created) < 1
    for a, b in zip(original.messages, imported.messages, strict=True):
        assert (a.role, a.content, a.thinking, a.state, a.finish_reason, a.stats, a.model) == (
            b.role, b.content, b.thinking, b.state, b.finish_reason, b.stats, b.model)
        assert b.reasoning == (a.reasoning if include_reasoning else "")
    # The import's own export matches (modulo ids): the format is stable.
    again = json.loads(db.export_json(new_id, include_reasoning=include_reasoning))
    assert again["messages"] == doc["messages"]


def test_import_minimal_and_bad_documents(db):
    new_id = db.import_json({"messages": [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"}]})
    conv = db.get_conversation(new_id)
    assert conv.title == "hi there" and [m.content for m in conv.messages] == ["hi there", "hello"]
    for bad, why in [
        ("not json", "Not JSON"),
        ("[1, 2]", "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "Message 1"),
        ({"format": "other.app", "messages": []}, "Unknown format"),
    ]:
        with pytest.raises(ImportFormatError, match=why):
            db.import_json(bad)
    assert len(db.list_conversations()) == 1  # a failed import adds nothing


def test_replies_in_flight_are_found_and_indexed_once_finished(db):
    conv = db.create_conversation("m")
    db.add_message(conv.id, "user", "q")
    writer = db.begin_reply(conv.id, interval=0)
    writer.append("streaming about pelicans")
    assert [h.message_id for h in db.search("pelicans")] == [writer.message_id]
    if db.search_uses_index:  # not re-indexed on every commit while it streams ...
        assert db._conn.execute("SELECT COUNT(*) FROM messages_fts WHERE rowid = ?", (writer.message_id,)).fetchone()[0] == 0
    writer.append(" and puffins")
    writer.finish()
    assert [h.message_id for h in db.search("puffins pelicans")] == [writer.message_id]
    if db.search_uses_index:  # ... but once, when it ends
        assert db._conn.execute("SELECT COUNT(*) FROM messages_fts WHERE messages_fts MATCH 'puffins'").fetchone()[0] == 1
        plan = " ".join(r[3] for r in db._conn.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM messages WHERE state = 'streaming'"))
        assert "messages_streaming" in plan
