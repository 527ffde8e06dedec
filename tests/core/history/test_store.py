"""The Store on real SQLite files: conversations, messages, titles, recovery of interrupted replies, delete and undo."""

from __future__ import annotations

import pytest

from macapp.core import paths
from macapp.core.history import SCHEMA_VERSION, MessageState, NotFoundError, ReplyStats, Role, Store, StoreError


def test_default_location_is_the_app_home_and_wal(_isolated_home, outside):
    with Store.open() as s:
        assert s.path == paths.db_path() == _isolated_home / "history.sqlite3"
        assert outside(s.path, "journal_mode") == "wal"
        assert s.database.query("PRAGMA busy_timeout")[0][0] >= 1000
        assert s.schema_version == SCHEMA_VERSION
        assert s.notice is None and not s.read_only


def test_conversation_round_trip_with_stats_and_title(store, sourdough):
    cid = sourdough(store)
    conv = store.get_conversation(cid)
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
    assert [c.id for c in store.list_conversations()] == [cid]
    assert store.list_conversations()[0].message_count == 2


def test_added_message_is_what_reads_back(store):
    conv = store.create_conversation("m")
    added = store.add_message(
        conv.id,
        "assistant",
        "done",
        reasoning="why",
        thinking=True,
        state="stopped",
        stats={"generation_tokens": 7, "ttft_s": 0.5},
        finish_reason="length",
        model="Qwen3.5-4B",
    )
    assert store.get_conversation(conv.id).messages == [added]
    assert store.get_conversation(conv.id).model == "Qwen3.5-4B"  # a reply's model becomes the conversation's


def test_only_the_first_user_message_titles_and_rename_wins(store):
    conv = store.create_conversation("m")
    assert store.get_conversation(conv.id).title == ""
    store.add_message(conv.id, "user", "First question")
    store.add_message(conv.id, "user", "Second question")
    assert store.get_conversation(conv.id).title == "First question"
    store.rename(conv.id, "  My   bread notes ")
    store.add_message(conv.id, "user", "Third")
    assert store.get_conversation(conv.id).title == "My bread notes"
    with pytest.raises(NotFoundError):
        store.rename(999, "x")


def test_list_is_newest_activity_first(store):
    a = store.create_conversation("m")
    b = store.create_conversation("m")
    store.add_message(a.id, "user", "later activity")
    assert [c.id for c in store.list_conversations()] == [a.id, b.id]
    assert [c.id for c in store.list_conversations(limit=1)] == [a.id]


def test_bad_role_or_unknown_conversation_is_refused(store):
    conv = store.create_conversation("m")
    with pytest.raises(StoreError, match="role"):
        store.add_message(conv.id, "tool", "x")
    with pytest.raises(StoreError, match="state"):
        store.add_message(conv.id, "user", "x", state="pending")
    with pytest.raises(NotFoundError, match="no conversation 4242"):
        store.add_message(4242, "user", "x")
    with pytest.raises(NotFoundError):
        store.get_conversation(4242)
    assert store.get_conversation(conv.id).messages == []  # nothing half-written


def test_interrupted_replies_are_marked_stopped(store):
    conv = store.create_conversation("m")
    writer = store.begin_reply(conv.id, interval=0)
    writer.append("half an ans")
    assert store.recover_interrupted() == 0  # still fresh: may be a live writer in another process
    assert store.recover_interrupted(older_than_s=-1) == 1
    reply = store.get_conversation(conv.id).messages[0]
    assert (reply.state, reply.finish_reason, reply.content) == ("stopped", "interrupted", "half an ans")


def test_truncate_for_regenerate(store, sourdough):
    cid = sourdough(store)
    removed = store.truncate(cid, 1)
    assert [m.role for m in removed] == ["assistant"]
    assert [m.role for m in store.get_conversation(cid).messages] == ["user"]
    store.add_message(cid, "assistant", "another take")
    assert [m.position for m in store.get_conversation(cid).messages] == [0, 1]


def test_delete_and_undo_keeps_ids(store, sourdough):
    cid = sourdough(store)
    before = store.get_conversation(cid)
    snapshot = store.delete(cid)
    assert store.list_conversations() == []
    with pytest.raises(NotFoundError):
        store.get_conversation(cid)
    newer = store.create_conversation("m")
    assert newer.id != cid  # ids are never reused, so undo can put it back where it was
    assert store.restore(snapshot) == cid
    after = store.get_conversation(cid)
    assert after.messages == before.messages and after.title == before.title
    assert store.search("sourdough")[0].conversation_id == cid


def test_what_reads_back_is_typed(store, sourdough):
    user, reply = store.get_conversation(sourdough(store)).messages
    assert (user.role, reply.role, reply.state) == (Role.USER, Role.ASSISTANT, MessageState.COMPLETE)
    assert store.search("sourdough")[0].role is Role.USER
