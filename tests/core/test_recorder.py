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
from macapp.core.events import TurnKind
from macapp.core.recorder import ChatRecorder, TurnResult
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
    base = dict(ttft_s=0.2, prompt_tokens=30, prompt_tps=300.0, generation_tokens=9, generation_tps=45.0, reasoning_tokens=4, peak_memory_bytes=1_234_000_000)
    return GenerationStats(**{**base, **kw})


def _turn(thinking=True, finish_reason="stop", kept=True):
    events = [PromptProgress(10, 30), PromptProgress(30, 30)]
    if thinking:
        events += [ReasoningDelta("Paris is "), ReasoningDelta("the capital.")]
    events += [AnswerDelta("It is "), StatsUpdate(_stats(generation_tokens=5)), AnswerDelta("Paris.")]
    reply = Reply(
        text="It is Paris.", reasoning="Paris is the capital." if thinking else "", thinking=thinking, finish_reason=finish_reason, stats=_stats(), kept=kept
    )
    return events + [Finished(reply)]


def _play(turn, events):
    for event in events:
        turn.feed(event)
    return turn.outcome


def test_a_turn_is_recorded_with_the_user_message_first(store):
    rec = ChatRecorder(store, model="Qwen3.5-0.8B", system_prompt="Be brief.", settings={"temperature": 0.6})
    assert rec.conversation_id is None  # nothing is created until someone speaks
    assert store.list_conversations() == []
    turn = rec.begin(TurnKind.SEND, "What is the capital of France?", thinking=True)
    assert _rows(store) == [("user", "What is the capital of France?", "", "complete")]  # committed before generation
    outcome = _play(turn, _turn())
    assert rec.error is None and turn.settled
    assert (outcome.kind, outcome.result, outcome.kept, outcome.give_back) == (TurnKind.SEND, TurnResult.COMPLETE, True, None)
    conv = store.get_conversation(rec.conversation_id)
    assert conv.title == "What is the capital of France?"
    assert (conv.model, conv.system_prompt, conv.settings) == ("Qwen3.5-0.8B", "Be brief.", {"temperature": 0.6})
    reply = conv.messages[1]
    assert (reply.role, reply.content, reply.reasoning, reply.thinking) == ("assistant", "It is Paris.", "Paris is the capital.", True)
    assert (reply.state, reply.finish_reason, reply.model) == ("complete", "stop", "Qwen3.5-0.8B")
    assert reply.stats.generation_tokens == 9 and reply.stats.peak_memory_bytes == 1_234_000_000
    assert rec.last_reply.id == reply.id == outcome.reply.id


def test_the_final_reply_text_wins_over_the_streamed_pieces(store):
    rec = ChatRecorder(store)
    turn = rec.begin(TurnKind.SEND, "hi")
    turn.feed(AnswerDelta("partial and wro"))
    assert turn.under_way and not turn.settled
    turn.feed(Finished(Reply(text="Hello!", finish_reason="stop")))
    turn.feed(AnswerDelta("ng"))  # a late piece (e.g. a listener's replay racing the worker) starts nothing
    assert [m.content for m in store.get_conversation(rec.conversation_id).messages] == ["hi", "Hello!"]


def test_stopped_length_and_rolled_back_turns(store):
    rec = ChatRecorder(store)
    stopped = _play(rec.begin(TurnKind.SEND, "one"), _turn(finish_reason="stopped"))
    cut = _play(rec.begin(TurnKind.SEND, "two", thinking=False), _turn(thinking=False, finish_reason="length"))
    assert (stopped.result, cut.result) == (TurnResult.STOPPED, TurnResult.COMPLETE)
    turn = rec.begin(TurnKind.SEND, "three")
    assert [m.content for m in store.get_conversation(rec.conversation_id).messages][-1] == "three"  # saved first
    turn.feed(PromptProgress(5, 100))
    assert not turn.under_way and len(store.get_conversation(rec.conversation_id).messages) == 5  # no reply row yet
    undone = _play(turn, [Finished(Reply(text="", finish_reason="stopped", kept=False))])  # stopped while reading
    messages = store.get_conversation(rec.conversation_id).messages
    assert [(m.role, m.state, m.finish_reason) for m in messages] == [
        ("user", "complete", None),
        ("assistant", "stopped", "stopped"),
        ("user", "complete", None),
        ("assistant", "complete", "length"),
    ]  # the engine kept nothing of turn three: neither does the history (the session rolled it back too)
    assert messages[3].thinking is False and messages[3].reasoning == ""
    assert (undone.result, undone.give_back) == (TurnResult.UNDONE, "three")  # e.g. the window puts it back in the composer
    assert len(store.get_conversation(rec.conversation_id).messages) == 4


def test_failures_keep_what_was_said(store):
    rec = ChatRecorder(store)
    failed = _play(rec.begin(TurnKind.SEND, "first"), [AnswerDelta("half an answ"), Failed("Metal ran out of memory.", code="error")])
    refused = _play(rec.begin(TurnKind.SEND, "second"), [Failed("The prompt would not fit the context limit.", code="context_limit")])
    messages = store.get_conversation(rec.conversation_id).messages
    assert [(m.role, m.content, m.state, m.finish_reason) for m in messages] == [
        ("user", "first", "complete", None),
        ("assistant", "half an answ", "stopped", "error"),
    ]  # the refused message is taken back (and handed back to the user); the failed reply's text is kept
    assert (failed.result, failed.error, failed.reply.content) == (TurnResult.FAILED, "Metal ran out of memory.", "half an answ")
    assert (refused.result, refused.code, refused.give_back) == (TurnResult.UNDONE, "context_limit", "second")


def test_a_refused_first_message_leaves_no_conversation(store):
    rec = ChatRecorder(store)
    outcome = _play(rec.begin(TurnKind.SEND, "too long"), [Failed("too long", code="context_limit")])
    assert outcome.give_back == "too long"
    assert rec.conversation_id is None and store.list_conversations() == []
    rec.begin(TurnKind.SEND, "shorter").feed(Finished(Reply(text="ok")))
    assert [m.content for m in store.get_conversation(rec.conversation_id).messages] == ["shorter", "ok"]


def test_events_from_a_worker_thread_stream_into_the_store(store):
    rec = ChatRecorder(store, interval=0.2)
    turn = rec.begin(TurnKind.SEND, "count", thinking=False)
    go, done, partly_seen = threading.Event(), threading.Event(), threading.Event()

    def worker():  # what Job.add_listener does: callbacks on the engine's thread
        go.wait()
        for i in range(60):
            turn.feed(AnswerDelta(f"{i} "))
            if i == 30:  # mid-stream until the reader has found part of the text on disk (an event, not a pause)
                partly_seen.wait(60)
            time.sleep(0.01)
        turn.feed(Finished(Reply(text="".join(f"{i} " for i in range(60)), finish_reason="stop")))
        done.set()

    thread = threading.Thread(target=worker)
    thread.start()
    go.set()
    seen = []
    with Store.open(store.path) as reader:
        while not done.is_set():
            messages = reader.get_conversation(rec.conversation_id).messages
            if len(messages) > 1:
                seen.append(messages[1].content)
                if messages[1].content:
                    partly_seen.set()
            time.sleep(0.05)
        thread.join(10)
        final = reader.get_conversation(rec.conversation_id).messages[1]
    assert any(0 < len(s) < len(final.content) for s in seen)  # partial text was visible while streaming
    assert all(final.content.startswith(s) for s in seen)
    assert final.state == "complete" and rec.error is None


def test_regenerate_and_edit_keep_the_old_turn_until_the_new_reply_is_under_way(store):
    rec = ChatRecorder(store)
    _play(rec.begin(TurnKind.SEND, "Tell me a joke", thinking=False), _turn(thinking=False))
    regen = rec.begin(TurnKind.REGENERATE, thinking=False)
    regen.feed(PromptProgress(1, 1))
    assert [(m.role, m.content) for m in store.get_conversation(rec.conversation_id).messages] == [
        ("user", "Tell me a joke"),
        ("assistant", "It is Paris."),
    ]  # not replaced while the prompt is read
    regen.feed(AnswerDelta("A better"))  # the regenerated reply streams in as usual, replacing the old one
    messages = store.get_conversation(rec.conversation_id).messages
    assert [m.role for m in messages] == ["user", "assistant"] and messages[-1].state == "streaming"
    regen.feed(Finished(Reply(text="A better joke.")))
    edit = rec.begin(TurnKind.EDIT, "Tell me a pun", thinking=False)
    assert store.get_conversation(rec.conversation_id).messages[0].content == "Tell me a joke"
    outcome = _play(edit, _turn(thinking=False))
    messages = store.get_conversation(rec.conversation_id).messages
    assert [(m.role, m.content) for m in messages] == [("user", "Tell me a pun"), ("assistant", "It is Paris.")]
    assert outcome.result is TurnResult.COMPLETE and outcome.give_back is None
    assert store.get_conversation(rec.conversation_id).title == "Tell me a joke"  # the title stays


@pytest.mark.parametrize("kind", [TurnKind.REGENERATE, TurnKind.EDIT])
@pytest.mark.parametrize(
    "end",
    [Failed("No room left in the context.", code="context_limit"), Failed("boom", code="error"), Finished(Reply(finish_reason="stopped", kept=False))],
    ids=["refused", "failed", "stopped-while-reading"],
)
def test_a_regenerate_or_edit_that_never_gets_under_way_leaves_the_old_turn(store, kind, end):
    rec = ChatRecorder(store)
    _play(rec.begin(TurnKind.SEND, "question"), _turn(thinking=False))
    before = _rows(store)
    outcome = _play(rec.begin(kind, "edited question"), [PromptProgress(0, 9), end])
    assert _rows(store) == before
    assert outcome.result is TurnResult.UNDONE
    assert outcome.give_back == ("edited question" if kind is TurnKind.EDIT else None)
    assert outcome.error == getattr(end, "message", None)


def test_the_history_agrees_with_a_session_only_when_it_holds_the_same_turns(store):
    rec = ChatRecorder(store, system_prompt="sys")
    assert rec.agrees_with([]) and rec.agrees_with([{"role": "system", "content": "sys"}])
    _play(rec.begin(TurnKind.SEND, "q"), [AnswerDelta("a"), Failed("boom")])  # the session has no reply; the history does
    session = [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"}]
    assert not rec.agrees_with(session)
    reply = {"role": "assistant", "content": "a", "reasoning": "", "thinking": False, "finish_reason": "error"}
    assert rec.agrees_with([*session, reply])
    assert not rec.agrees_with([*session, {**reply, "reasoning": "hidden"}])


def test_resume_continues_a_saved_conversation(store):
    first = ChatRecorder(store, model="Qwen3.5-2B", system_prompt="sys")
    first.begin(TurnKind.SEND, "hello").feed(Finished(Reply(text="hi")))
    rec = ChatRecorder.resume(store, first.conversation_id)
    assert (rec.model, rec.system_prompt) == ("Qwen3.5-2B", "sys")
    rec.model = "Qwen3.5-9B"  # the model loaded now: its replies record it, and so does the conversation
    rec.begin(TurnKind.SEND, "again").feed(Finished(Reply(text="hello again")))
    conv = store.get_conversation(first.conversation_id)
    assert [m.model for m in conv.messages if m.role == "assistant"] == ["Qwen3.5-2B", "Qwen3.5-9B"]
    assert conv.model == "Qwen3.5-9B"
    reply = {"reasoning": "", "thinking": False, "finish_reason": "stop"}
    assert conv.chat_messages() == [  # the shape engine.new_session(messages=...) takes back
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi", **reply},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "hello again", **reply},
    ]
    assert conv.chat_messages(include_system=False)[0] == {"role": "user", "content": "hello"}
    with pytest.raises(NotFoundError):
        ChatRecorder.resume(store, 999)


def test_an_unfinished_reply_is_kept_when_the_next_turn_starts(store):
    rec = ChatRecorder(store)
    dangling = rec.begin(TurnKind.SEND, "q1")
    dangling.feed(AnswerDelta("dangling"))
    rec.begin(TurnKind.SEND, "q2")
    messages = store.get_conversation(rec.conversation_id).messages
    assert [(m.content, m.state, m.finish_reason) for m in messages] == [
        ("q1", "complete", None),
        ("dangling", "stopped", "abandoned"),
        ("q2", "complete", None),
    ]
    assert dangling.outcome.result is TurnResult.STOPPED
    dangling.feed(Finished(Reply(text="too late")))  # its events, if any still come, change nothing
    assert store.get_conversation(rec.conversation_id).messages[1].content == "dangling"


def test_storage_failures_never_escape_feed(tmp_path):
    s = Store.open(tmp_path / "h.sqlite3")
    rec = ChatRecorder(s)
    turn = rec.begin(TurnKind.SEND, "q")
    turn.feed(AnswerDelta("x"))
    s.close()
    turn.feed(AnswerDelta("y"))
    turn.feed(Finished(Reply(text="xy")))
    assert isinstance(rec.error, (StoreError, sqlite3.Error))
    assert turn.outcome is not None and turn.outcome.result is TurnResult.FAILED
    other = ChatRecorder(Store.open(tmp_path / "other.sqlite3"))
    other.begin(TurnKind.REGENERATE).feed(AnswerDelta("x"))  # a reply with no user message to answer
    assert isinstance(other.error, StoreError) and "user's message" in str(other.error)
    assert other.store.list_conversations() == []


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
    from macapp.core.demo.tiny_model import SCRIPT_ANSWER, SCRIPT_REASONING

    session = engine.new_session(system_prompt="Be brief.")
    rec = ChatRecorder(store, model="tiny-moe", system_prompt="Be brief.")
    for text in ("hello there", "and again"):
        turn = rec.begin(TurnKind.SEND, text, thinking=True)  # committed before the engine sees it
        job = session.send(text, thinking=True, sampling=greedy(60))
        for event in job.events(timeout=120):  # the chat CLI's loop; the window feeds coalesced batches
            turn.feed(event)
        reply = job.result(timeout=60)
        assert rec.error is None and turn.outcome.result is TurnResult.COMPLETE
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
    turn = again.begin(TurnKind.SEND, "third time", thinking=False)
    job = reopened.send("third time", thinking=False, sampling=greedy(60))
    job.add_listener(turn.feed)  # on the worker thread, as the API server does
    job.join(timeout=120)
    assert turn.settled and again.agrees_with(reopened.messages)
    assert store.get_conversation(conv.id).chat_messages() == reopened.messages
