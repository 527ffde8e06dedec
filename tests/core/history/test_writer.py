"""ReplyWriter: a streaming reply reaches the disk at most once per interval, never stale for long, always at the end."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from macapp.core.history import Store, StoreError


def test_reply_commits_are_throttled_but_never_stale_for_long(store, committed):
    conv = store.create_conversation("m")
    store.add_message(conv.id, "user", "q")
    writer = store.begin_reply(conv.id, interval=0.4)
    assert committed(store.path, writer.message_id) == ("", "", "streaming")  # the row exists before any token
    start = time.monotonic()
    while time.monotonic() - start < 1.0:
        writer.append("tok ")
        time.sleep(0.005)
    # ~100 appends in 1 s, committed at most every 0.4 s (the first commit may come at once).
    assert 2 <= writer.commits <= 4
    # A stalled stream still reaches the disk, with no further append (within the interval; waited on, not timed).
    writer.append("LAST")
    deadline = time.monotonic() + 60
    while not committed(store.path, writer.message_id)[0].endswith("tok LAST") and time.monotonic() < deadline:
        time.sleep(0.05)
    content, _, state = committed(store.path, writer.message_id)
    assert content.endswith("tok LAST") and state == "streaming"
    message = writer.finish(None, "length", stopped=True)
    assert message.state == "stopped"
    assert committed(store.path, writer.message_id)[2] == "stopped"
    with pytest.raises(StoreError, match="already finished"):
        writer.append("more")


def test_update_replaces_the_text_so_far(store, committed):
    conv = store.create_conversation("m")
    writer = store.begin_reply(conv.id, interval=0)
    writer.update("draft", "thinking")
    writer.update("final answer")
    assert committed(store.path, writer.message_id)[:2] == ("final answer", "thinking")
    writer.finish()
    assert store.get_conversation(conv.id).messages[0].state == "complete"


def test_finish_commits_stats_and_reason_once(store):
    conv = store.create_conversation("m")
    writer = store.begin_reply(conv.id, interval=60)
    writer.append("all of it", "why")
    first = writer.finish({"generation_tokens": 3, "ttft_s": 0.2}, "stop")
    assert writer.finish({"generation_tokens": 99}, "length") is first  # a second finish changes nothing
    saved = store.get_conversation(conv.id).messages[0]
    assert (saved.content, saved.reasoning, saved.finish_reason, saved.state) == ("all of it", "why", "stop", "complete")
    assert (saved.stats.generation_tokens, saved.stats.ttft_s) == (3, 0.2)


def test_a_failed_commit_is_kept_and_the_stream_goes_on(tmp_path, committed):
    path = tmp_path / "history.sqlite3"
    with Store.open(path, busy_timeout_s=0.1) as s:
        conv = s.create_conversation("m")
        writer = s.begin_reply(conv.id, interval=0)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            writer.append("kept in memory")
            assert isinstance(writer.error, StoreError) and "busy" in str(writer.error)
        finally:
            other.execute("ROLLBACK")
            other.close()
        writer.finish(None, "stop")
        assert writer.error is None
        assert committed(path, writer.message_id) == ("kept in memory", "", "complete")


def test_writer_survives_its_conversation_being_deleted(store):
    conv = store.create_conversation("m")
    writer = store.begin_reply(conv.id, interval=0)
    store.delete(conv.id)
    writer.append("orphan text")
    writer.finish()
    assert writer.error is None
    assert store.list_conversations() == []


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

    def readers_read_again() -> None:  # each reader reads at least once more: reads and writes interleave
        counts = [len(lengths) for lengths in seen]
        deadline = time.monotonic() + 60
        while any(len(lengths) <= n for lengths, n in zip(seen, counts)) and not errors and time.monotonic() < deadline:
            time.sleep(0.001)

    for i in range(300):
        writer.append(f"w{i} ")
        if i % 50 == 0:
            readers_read_again()
    writer.finish(None, "stop")
    readers_read_again()
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
