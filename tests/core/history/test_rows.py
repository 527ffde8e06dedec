"""Rows <-> records: a message's every field goes into its row and comes back, the columns follow the records."""

from __future__ import annotations

from dataclasses import fields, replace

from macapp.core.history import Message, MessageState, ReplyStats, Role
from macapp.core.history import rows
from macapp.core.vision.refs import ImageRef

STATS = ReplyStats(
    ttft_s=0.25, prompt_tokens=412, prompt_tps=1830.5, generation_tokens=128, generation_tps=41.2, reasoning_tokens=17, peak_memory_bytes=1_300_000_000
)


def _message(conversation_id: int) -> Message:
    return Message(
        id=0,
        conversation_id=conversation_id,
        position=3,
        role=Role.ASSISTANT,
        content="It is Paris.",
        reasoning="The capital of France.",
        thinking=True,
        state=MessageState.STOPPED,
        finish_reason="stopped",
        stats=STATS,
        model="Qwen3.5-4B",
        created=1_764_000_000.5,
        images=(ImageRef("ab" * 32, "cat.png", 64, 48),),
        cache_tokens=(7, 0, 248_077, 2**32 - 1),
    )


def _read_back(store, message_id: int) -> Message:
    (row,) = store.database.query(f"{rows.SELECT_MESSAGES} WHERE id = ?", (message_id,))
    return rows.message_from_row(row)


def test_every_field_of_a_message_goes_into_its_row_and_comes_back(store):
    conv = store.create_conversation("Qwen3.5-4B")
    m = _message(conv.id)
    with store.database.write() as conn:
        m.id = conn.execute(rows.INSERT_MESSAGE, rows.message_values(m, id=None, conversation_id=conv.id, position=3)).lastrowid
    back = _read_back(store, m.id)
    assert back == m
    assert back.role is Role.ASSISTANT and back.state is MessageState.STOPPED and back.thinking is True
    assert back.images == m.images and back.stats == STATS and back.cache_tokens == (7, 0, 248_077, 2**32 - 1)


def test_a_finished_reply_updates_its_text_state_and_every_figure(store):
    conv = store.create_conversation("Qwen3.5-4B")
    m = replace(_message(conv.id), content="", reasoning="", state=MessageState.STREAMING, finish_reason=None, stats=ReplyStats(), images=(), cache_tokens=())
    with store.database.write() as conn:
        m.id = conn.execute(rows.INSERT_MESSAGE, rows.message_values(m, id=None, conversation_id=conv.id, position=3)).lastrowid
    done = replace(m, content="Done.", reasoning="why", state=MessageState.COMPLETE, finish_reason="stop", stats=STATS, cache_tokens=(3, 1, 4))
    with store.database.write() as conn:
        assert conn.execute(rows.FINISH_REPLY, rows.finish_values(done)).rowcount == 1
    assert _read_back(store, m.id) == done


def test_the_columns_are_the_records_fields():
    """One declaration: a field added to Message or ReplyStats is a column of every insert, update and read."""
    message = [f.name for f in fields(Message) if f.name != "stats"]
    stats = [f.name for f in fields(ReplyStats)]
    assert rows.MESSAGE_COLUMNS == tuple(message + stats)
    assert rows.INSERT_MESSAGE.count("?") == len(rows.MESSAGE_COLUMNS)
    assert all(f"{name} = ?" in rows.FINISH_REPLY for name in stats)
    assert rows.stats_values(STATS) == tuple(getattr(STATS, name) for name in stats)


def test_saved_tokens_that_are_not_whole_ids_read_as_none():
    assert rows.tokens_blob(()) is None and rows.tokens_from_blob(None) == ()
    assert rows.tokens_from_blob(rows.tokens_blob((1, 2))) == (1, 2) and rows.tokens_from_blob(b"\x01\x00\x00") == ()
    assert rows.tokens_blob((1, 256)) == bytes([1, 0, 0, 0, 0, 1, 0, 0])  # little-endian uint32s on every machine


def test_a_conversation_row_with_unreadable_settings_reads_as_no_settings(store):
    conv = store.create_conversation("Qwen3.5-4B", settings={"thinking": True})
    with store.database.write() as conn:
        conn.execute("UPDATE conversations SET settings = ? WHERE id = ?", ("{not json", conv.id))
    assert store.get_conversation(conv.id).settings == {}
    with store.database.write() as conn:
        conn.execute("UPDATE conversations SET settings = ? WHERE id = ?", ("[1, 2]", conv.id))
    assert store.get_conversation(conv.id).settings == {}
