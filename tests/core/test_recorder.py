"""ChatRecorder: the engine's real event records in, committed history out (no model needed)."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from macapp.core.events import (
    AnswerDelta,
    Failed,
    Finished,
    GenerationStats,
    PromptProgress,
    ReasoningDelta,
    Reply,
    StatsUpdate,
)
from macapp.core.recorder import ChatRecorder
from macapp.core.history import NotFoundError, Store, StoreError


@pytest.fixture
def store(tmp_path):
    with Store.open(tmp_path / "history.sqlite3") as s:
        yield s


def _rows(store: Store):
    conn = sqlite3.connect(store.path)
    try:
        return conn.execute("SELECT role, content, reasoning, state FROM messages ORDER BY conversation_id, position").fetchall()
    finally:
        conn.close()


def _stats(**kw) -> GenerationStats:
    base = dict(ttft_s=0.2, prompt_tokens=30, prompt_tps=300.0, generation_tokens=9, generation_tps=45.0,
                reasoning_tokens=4, peak_memory_bytes=1_234_000_000)
    return GenerationStats(**{**base, **kw})


def _turn(thinking=True, finish_reason="stop", kept=True):
    events = [PromptProgress(10, 30), PromptProgress(30, 30)]
    if thinking:
        events += [ReasoningDelta("Paris is "), ReasoningDelta("the capital.")]
    events += [AnswerDelta("It is "), StatsUpdate(_stats(generation_tokens=5)), AnswerDelta("Paris.")]
    reply = Reply(text="It is Paris.", reasoning="Paris is the capital." if thinking else "", thinking=thinking,
                  finish_reason=finish_reason, stats=_stats(), kept=kept)
    return events + [Finished(reply)]


def test_a_turn_is_recorded_with_the_user_message_first(store):
    rec = ChatRecorder(store, model="Qwen3.5-0.8B", system_prompt="Be brief.", settings={"temperature": 0.6})
    assert rec.conversation_id is None  # nothing is created until someone speaks
    assert store.list_conversations() == []
    rec.user("What is the capital of France?", thinking=True)
    assert _rows(store) == [("user", "What is the capital of France?", "", "complete")]  # committed before generation
    for event in _turn():
        rec.on_event(event)
    assert rec.error is None and not rec.in_reply
    conv = store.get_conversation(rec.conversation_id)
    assert conv.title == "What is the capital of France?"
    assert (conv.model, conv.system_prompt, conv.settings) == ("Qwen3.5-0.8B", "Be brief.", {"temperature": 0.6})
    reply = conv.messages[1]
    assert (reply.role, reply.content, reply.reasoning, reply.thinking) == ("assistant", "It is Paris.", "Paris is the capital.", True)
    assert (reply.state, reply.finish_reason, reply.model) == ("complete", "stop", "Qwen3.5-0.8B")
    assert reply.stats.generation_tokens == 9 and reply.stats.peak_memory_bytes == 1_234_000_000
    assert rec.last_reply.id == reply.id


def test_the_final_reply_text_wins_over_the_streamed_pieces(store):
    rec = ChatRecorder(store)
    rec.user("hi")
    rec.on_event(AnswerDelta("partial and wro"))
    rec.on_event(Finished(Reply(text="Hello!", finish_reason="stop")))
    rec.on_event(AnswerDelta("ng"))  # a late piece (e.g. a listener's replay racing the worker) starts nothing
    assert [m.content for m in store.get_conversation(rec.conversation_id).messages] == ["hi", "Hello!"]


def test_stopped_length_and_rolled_back_turns(store):
    rec = ChatRecorder(store)
    rec.user("one")
    for event in _turn(finish_reason="stopped"):
        rec.on_event(event)
    rec.user("two")
    for event in _turn(thinking=False, finish_reason="length"):
        rec.on_event(event)
    rec.user("three")
    rec.begin_assistant()
    rec.on_event(PromptProgress(5, 100))
    rec.on_event(Finished(Reply(text="", finish_reason="stopped", kept=False)))  # stopped while reading the prompt
    messages = store.get_conversation(rec.conversation_id).messages
    assert [(m.role, m.state, m.finish_reason) for m in messages] == [
        ("user", "complete", None), ("assistant", "stopped", "stopped"),
        ("user", "complete", None), ("assistant", "complete", "length"),
        ("user", "complete", None),  # the user's words are kept; the empty reply is not
    ]
    assert messages[3].thinking is False and messages[3].reasoning == ""
    assert rec.retract_last_user() == "three"  # e.g. the window puts it back in the composer
    assert len(store.get_conversation(rec.conversation_id).messages) == 4
    assert rec.retract_last_user() is None


def test_failures_keep_what_was_said(store):
    rec = ChatRecorder(store)
    rec.user("first")
    rec.on_event(AnswerDelta("half an answ"))
    rec.on_event(Failed("Metal ran out of memory.", code="error"))
    rec.user("second")
    rec.begin_assistant()
    rec.on_event(Failed("The prompt would not fit the context limit.", code="context_limit"))
    messages = store.get_conversation(rec.conversation_id).messages
    assert [(m.role, m.content, m.state, m.finish_reason) for m in messages] == [
        ("user", "first", "complete", None),
        ("assistant", "half an answ", "stopped", "error"),
        ("user", "second", "complete", None),
    ]


def test_events_from_a_worker_thread_stream_into_the_store(store):
    rec = ChatRecorder(store, interval=0.2)
    rec.user("count")
    rec.begin_assistant(thinking=False)
    go, done = threading.Event(), threading.Event()

    def worker():  # what Job.add_listener does: callbacks on the engine's thread
        go.wait()
        for i in range(60):
            rec.on_event(AnswerDelta(f"{i} "))
            time.sleep(0.01)
        rec.on_event(Finished(Reply(text="".join(f"{i} " for i in range(60)), finish_reason="stop")))
        done.set()

    thread = threading.Thread(target=worker)
    thread.start()
    go.set()
    seen = []
    with Store.open(store.path) as reader:
        while not done.is_set():
            seen.append(reader.get_conversation(rec.conversation_id).messages[1].content)
            time.sleep(0.05)
        thread.join(10)
        final = reader.get_conversation(rec.conversation_id).messages[1]
    assert any(0 < len(s) < len(final.content) for s in seen)  # partial text was visible while streaming
    assert all(final.content.startswith(s) for s in seen)
    assert final.state == "complete" and rec.error is None


def test_regenerate_and_edit_last_mirror_the_session(store):
    rec = ChatRecorder(store)
    rec.user("Tell me a joke")
    for event in _turn(thinking=False):
        rec.on_event(event)
    rec.discard_last_reply()
    assert [m.role for m in store.get_conversation(rec.conversation_id).messages] == ["user"]
    rec.on_event(AnswerDelta("A better"))  # the regenerated reply streams in as usual
    assert store.get_conversation(rec.conversation_id).messages[-1].state == "streaming"
    rec.finish(text="A better joke.")
    rec.edit_last_user("Tell me a pun")
    for event in _turn(thinking=False):
        rec.on_event(event)
    messages = store.get_conversation(rec.conversation_id).messages
    assert [(m.role, m.content) for m in messages] == [("user", "Tell me a pun"), ("assistant", "It is Paris.")]
    assert store.get_conversation(rec.conversation_id).title == "Tell me a joke"  # the title stays


def test_resume_continues_a_saved_conversation(store):
    first = ChatRecorder(store, model="Qwen3.5-2B", system_prompt="sys")
    first.user("hello")
    first.finish(text="hi")
    rec = ChatRecorder.resume(store, first.conversation_id)
    assert (rec.model, rec.system_prompt) == ("Qwen3.5-2B", "sys")
    rec.set_model("Qwen3.5-9B")
    rec.user("again")
    rec.finish(text="hello again")
    conv = store.get_conversation(first.conversation_id)
    assert [m.model for m in conv.messages if m.role == "assistant"] == ["Qwen3.5-2B", "Qwen3.5-9B"]
    assert conv.model == "Qwen3.5-9B"
    reply = {"reasoning": "", "thinking": False, "finish_reason": "stop"}
    assert conv.chat_messages() == [  # the shape engine.new_session(messages=...) takes back
        {"role": "system", "content": "sys"}, {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi", **reply}, {"role": "user", "content": "again"},
        {"role": "assistant", "content": "hello again", **reply},
    ]
    assert conv.chat_messages(include_system=False)[0] == {"role": "user", "content": "hello"}
    with pytest.raises(NotFoundError):
        ChatRecorder.resume(store, 999)


def test_an_unfinished_reply_is_kept_when_the_next_turn_starts(store):
    rec = ChatRecorder(store)
    rec.user("q1")
    rec.on_delta("dangling")
    rec.user("q2")
    messages = store.get_conversation(rec.conversation_id).messages
    assert [(m.content, m.state, m.finish_reason) for m in messages] == [
        ("q1", "complete", None), ("dangling", "stopped", "abandoned"), ("q2", "complete", None)]


def test_storage_failures_never_escape_on_event(tmp_path):
    s = Store.open(tmp_path / "h.sqlite3")
    rec = ChatRecorder(s)
    rec.user("q")
    rec.begin_assistant()
    s.close()
    rec.on_event(AnswerDelta("x"))
    rec.on_event(Finished(Reply(text="x")))
    assert isinstance(rec.error, (StoreError, sqlite3.Error))
    with pytest.raises(StoreError, match="user's message"):
        ChatRecorder(Store.open(tmp_path / "other.sqlite3")).begin_assistant()


# ---------------------------------------------------------------- with the real engine on a tiny model


@pytest.fixture(scope="module")
def engine(tiny_moe_path):
    from macapp.core.engine import Engine

    e = Engine()
    e.load(str(tiny_moe_path)).result(timeout=120)
    yield e
    e.close()


def test_a_real_engine_turn_is_recorded_and_reopens_into_a_session(engine, store):
    from macapp.core.sampling import greedy
    from macapp.devtools.tiny_model import SCRIPT_ANSWER, SCRIPT_REASONING

    session = engine.new_session(system_prompt="Be brief.")
    rec = ChatRecorder(store, model="tiny-moe", system_prompt="Be brief.")
    for text in ("hello there", "and again"):
        rec.user(text, thinking=True)  # committed before the engine sees it
        job = session.send(text, thinking=True, sampling=greedy(60))
        rec.begin_assistant(thinking=True)
        for event in job.events(timeout=120):  # the chat CLI's loop; the window uses job.add_listener
            rec.on_event(event)
        reply = job.result(timeout=1)
        assert rec.error is None
        saved = store.get_conversation(rec.conversation_id).messages[-1]
        assert (saved.content, saved.reasoning) == (reply.text, reply.reasoning)
        assert saved.reasoning == "".join(SCRIPT_REASONING) and saved.content == "".join(SCRIPT_ANSWER)
        assert saved.stats.generation_tokens == reply.stats.generation_tokens > 0
        assert saved.stats.peak_memory_bytes == reply.stats.peak_memory_bytes
        assert (saved.state, saved.finish_reason) == ("complete", reply.finish_reason)
    conv = store.get_conversation(rec.conversation_id)
    # The saved conversation is exactly what the session holds, so reopening it continues the same chat.
    assert conv.chat_messages() == session.messages
    reopened = engine.new_session(system_prompt=conv.system_prompt, messages=conv.chat_messages(include_system=False))
    assert reopened.messages == session.messages
    again = ChatRecorder.resume(store, conv.id)
    again.user("third time", thinking=False)
    job = reopened.send("third time", thinking=False, sampling=greedy(60))
    for event in job.events(timeout=120):
        again.on_event(event)
    assert store.get_conversation(conv.id).chat_messages() == reopened.messages
