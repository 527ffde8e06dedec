"""The Qt-free conversation model on the real engine, the tiny model and a real history: where a turn is recorded
(off the caller's thread, before anyone sees an event), in what order, and what happens to the session after."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from macapp.core.conversation import ConversationModel, starts_reply
from macapp.core.engine import Engine, SessionOptions
from macapp.core.events import AnswerDelta, Failed, Finished, PromptProgress, ReasoningDelta, Reply, TurnKind
from macapp.core.history import Store
from macapp.core.recorder import ChatRecorder, TurnResult
from macapp.core.sampling import greedy
from macapp.core.demo.tiny_model import SCRIPT_ANSWER

ANSWER = "".join(SCRIPT_ANSWER)
TIMEOUT = 60


@pytest.fixture(scope="module")
def engine(tiny_moe_path):
    e = Engine()
    e.load(str(tiny_moe_path)).result(timeout=TIMEOUT)
    yield e
    e.close()


@pytest.fixture
def store(tmp_path):
    with Store.open(tmp_path / "history.sqlite3") as s:
        yield s


@pytest.fixture
def endless(engine):
    vocab = engine.model.tokenizer.get_vocab()
    return greedy(4000, logit_bias={vocab["<|im_end|>"]: -1e9, vocab["<|endoftext|>"]: -1e9})


def model_for(engine, store, **kwargs) -> ConversationModel:
    recorder = ChatRecorder(store, model="tiny", interval=0.0) if store is not None else None
    return ConversationModel(lambda system, messages: engine.new_session(system, messages), recorder, **kwargs)


def rows(store, conversation_id):
    return [(m.role, m.content, m.state, m.finish_reason) for m in store.get_conversation(conversation_id).messages]


def writes_on_threads(store):
    """Record the thread of every write to the store (the real write, called through)."""
    seen: list[threading.Thread] = []
    real = store.database.write

    def write():
        seen.append(threading.current_thread())
        return real()

    store.database.write = write
    return seen


def test_a_turn_is_recorded_off_the_callers_thread_before_anyone_sees_an_event(engine, store):
    threads = writes_on_threads(store)
    conversation = model_for(engine, store)
    turn = conversation.start(TurnKind.SEND, "hello", thinking=False, sampling=greedy(32))
    saved_when_seen = []

    def listener(event):  # runs on the recording thread: the event is in the history already
        messages = store.get_conversation(conversation.conversation_id).messages
        saved_when_seen.append((type(event), [m.role.value for m in messages], messages[-1].content))

    turn.add_listener(listener)
    last = turn.wait(TIMEOUT)
    assert isinstance(last, Finished) and last.reply.text == ANSWER
    assert [e for e in turn.events()] == turn.history == turn.job.history  # every event, once, in the job's order
    assert saved_when_seen[0][1][0] == "user"  # the message was committed before the first event was passed on
    first_text = next(i for i, (kind, *_r) in enumerate(saved_when_seen) if kind is AnswerDelta)
    assert saved_when_seen[first_text][1] == ["user", "assistant"]  # the reply row exists once its text is seen
    assert saved_when_seen[-1][2] == ANSWER  # the final text is committed before the terminal event is passed on
    assert turn.outcome.result is TurnResult.COMPLETE and turn.done
    assert threads and threading.main_thread() not in threads  # nothing was written on the caller's thread
    assert rows(store, conversation.conversation_id) == [("user", "hello", "complete", None), ("assistant", ANSWER, "complete", "stop")]


def test_a_refused_send_leaves_nothing_and_keeps_the_session(engine, store):
    conversation = model_for(engine, store)
    conversation.start(TurnKind.SEND, "first", thinking=False, sampling=greedy(16)).wait(TIMEOUT)
    session = conversation.session
    session.options = replace(session.options, context_limit=4)  # no room for another turn
    turn = conversation.start(TurnKind.SEND, "too much", thinking=False, sampling=greedy(16))
    assert isinstance(turn.wait(TIMEOUT), Failed)
    assert turn.outcome.result is TurnResult.UNDONE and turn.outcome.give_back == "too much"
    assert [r[1] for r in rows(store, conversation.conversation_id)] == ["first", ANSWER]
    assert conversation.session is session  # it agrees with the history: kept


def test_a_failed_reply_sets_the_session_aside_and_the_next_one_reads_what_the_history_kept(engine, store):
    conversation = model_for(engine, store)
    conversation.start(TurnKind.SEND, "first", thinking=False, sampling=greedy(16)).wait(TIMEOUT)
    session = conversation.session
    prompt = engine.model.tokenizer.apply_chat_template([{"role": "user", "content": "this will fail"}], add_generation_prompt=True, enable_thinking=False)
    # kv_group_size 128 cannot quantize the tiny model's 64-wide heads: mlx fails once the cache passes `start`
    start = session.context_tokens + len(prompt) + 2 + 4
    session.options = replace(session.options, kv_bits=4, kv_group_size=128, quantized_kv_start=start)
    turn = conversation.start(TurnKind.SEND, "this will fail", thinking=False, sampling=greedy(64))
    assert isinstance(turn.wait(TIMEOUT), Failed) and turn.outcome.result is TurnResult.FAILED
    kept = rows(store, conversation.conversation_id)[-1]
    assert kept[0] == "assistant" and kept[1] and kept[2:] == ("stopped", "error")
    assert conversation.session is None  # set aside on the recording thread, before the terminal event came here
    after = conversation.start(TurnKind.SEND, "and now?", thinking=False, sampling=greedy(16))
    assert isinstance(after.wait(TIMEOUT), Finished)
    assert conversation.session is not session
    assert [m["content"] for m in conversation.session.messages][:4] == ["first", ANSWER, "this will fail", kept[1]]


def test_a_sends_message_is_saved_at_once_even_while_the_engine_is_busy(engine, store):
    conversation = model_for(engine, store)
    gate, parked = threading.Event(), threading.Event()
    engine.submit("test-gate", lambda _job: (parked.set(), gate.wait(TIMEOUT)))  # the worker is busy with other work
    assert parked.wait(TIMEOUT)
    try:
        turn = conversation.start(TurnKind.SEND, "saved first", thinking=False, sampling=greedy(16))
        for _ in range(100):  # up to 5 s
            if conversation.conversation_id is not None:
                break
            threading.Event().wait(0.05)
        assert rows(store, conversation.conversation_id) == [("user", "saved first", "complete", None)]
        assert turn.job.history == []  # the engine has not begun the turn: a crash now keeps what was typed
    finally:
        gate.set()
    assert isinstance(turn.wait(TIMEOUT), Finished)
    assert [r[0] for r in rows(store, conversation.conversation_id)] == ["user", "assistant"]


def test_a_stopped_turn_keeps_what_it_wrote_and_the_next_one_follows_it(engine, store, endless):
    conversation = model_for(engine, store)
    long = conversation.start(TurnKind.SEND, "talk forever", thinking=False, sampling=endless)
    pieces = []

    def stop_after_some(event):  # on the worker: stops it at an exact point
        if isinstance(event, (AnswerDelta, ReasoningDelta)):
            pieces.append(event)
            if len(pieces) == 8:
                long.stop()

    long.job.add_listener(stop_after_some)
    assert isinstance(long.wait(TIMEOUT), Finished) and long.outcome.result is TurnResult.STOPPED
    nxt = conversation.start(TurnKind.SEND, "next", thinking=False, sampling=greedy(16))
    assert isinstance(nxt.wait(TIMEOUT), Finished)
    saved = rows(store, conversation.conversation_id)
    assert [(r[0], r[1]) for r in saved[::2]] == [("user", "talk forever"), ("user", "next")]
    assert saved[1][2:] == ("stopped", "stopped") and saved[1][1] and saved[3] == ("assistant", ANSWER, "complete", "stop")


def test_a_turn_listener_added_while_events_flow_gets_each_event_once_in_order(engine, endless):
    conversation = model_for(engine, None)
    turn = conversation.start(TurnKind.SEND, "go", thinking=False, sampling=endless.with_overrides(max_tokens=48))
    gate, held, ended = threading.Event(), threading.Event(), threading.Event()
    pieces = []

    def hold(event):  # on the worker: the reply waits at its 5th piece until the listener below is being replayed
        if isinstance(event, (AnswerDelta, ReasoningDelta)):
            pieces.append(event)
            if len(pieces) == 5:
                held.set()
                gate.wait(TIMEOUT)

    turn.job.add_listener(hold)
    turn.add_listener(lambda e: ended.set() if isinstance(e, Finished) else None)
    assert held.wait(TIMEOUT)
    assert not turn.done
    me = threading.current_thread()
    got, threads = [], []

    def listener(event):
        if not got:  # replaying the past on this thread: the rest of the turn is recorded and emitted meanwhile
            gate.set()
            assert ended.wait(TIMEOUT)
        got.append(event)
        threads.append(threading.current_thread())

    turn.add_listener(listener)
    assert isinstance(turn.wait(TIMEOUT), Finished)
    assert got == turn.history == turn.job.history and sum(isinstance(e, Finished) for e in got) == 1
    assert len(pieces) > 5 and set(threads) == {me}  # pieces came after it was added, delivered here after the past


def test_strict_a_start_that_cannot_be_saved_stops_the_turn_and_gives_the_text_back(engine, store):
    conversation = model_for(engine, store, strict=True)
    store.database.read_only = True  # every write now raises ReadOnlyStoreError
    turn = conversation.start(TurnKind.SEND, "keep me", thinking=False, sampling=greedy(16))
    last = turn.wait(TIMEOUT)
    assert turn.record_error is not None and turn.job.stopped
    assert turn.outcome.result is TurnResult.UNDONE and turn.outcome.give_back == "keep me"
    assert not (isinstance(last, Finished) and last.reply.text == ANSWER)  # it did not run to its end
    store.database.read_only = False
    assert store.list_conversations() == []


def test_not_strict_a_start_that_cannot_be_saved_runs_unrecorded_and_says_why(engine, store):
    conversation = model_for(engine, store)
    store.database.read_only = True
    turn = conversation.start(TurnKind.SEND, "hello", thinking=False, sampling=greedy(32))
    last = turn.wait(TIMEOUT)
    assert isinstance(last, Finished) and last.reply.text == ANSWER
    assert turn.outcome is None and conversation.recorder.error is not None


def test_without_a_recorder_a_turn_only_runs(engine):
    conversation = model_for(engine, None, system_prompt="Be brief.")
    turn = conversation.start(TurnKind.SEND, "hello", thinking=False, sampling=greedy(32))
    assert isinstance(turn.wait(TIMEOUT), Finished) and turn.outcome is None and conversation.conversation_id is None
    assert conversation.session.messages[0] == {"role": "system", "content": "Be brief."}


def test_a_saved_conversation_is_read_into_the_first_session_once(engine, store):
    first = model_for(engine, store)
    first.start(TurnKind.SEND, "remember me", thinking=False, sampling=greedy(16)).wait(TIMEOUT)
    saved = store.get_conversation(first.conversation_id)
    reopened = ConversationModel(
        lambda system, messages: engine.new_session(system, messages, SessionOptions()),
        ChatRecorder(store, saved.id, model="tiny"),
        saved=saved,
    )
    assert reopened.session is None  # made by the next turn
    turn = reopened.start(TurnKind.SEND, "still there?", thinking=False, sampling=greedy(16))
    assert isinstance(turn.wait(TIMEOUT), Finished)
    assert [m["content"] for m in reopened.session.messages] == ["remember me", ANSWER, "still there?", ANSWER]


def test_the_rule_for_a_reply_under_way():
    assert starts_reply(AnswerDelta("a")) and starts_reply(ReasoningDelta("r")) and starts_reply(Finished(Reply(text="x")))
    assert not starts_reply(Finished(Reply(kept=False))) and not starts_reply(PromptProgress(0, 10))
    assert not starts_reply(Failed("no"))


def test_while_the_local_api_serves_a_turn_runs_in_its_batch_and_is_recorded_the_same(engine, store):
    from macapp.core.serving.runner import ServingEngine, ServingOptions

    alone = model_for(engine, store)
    alone.start(TurnKind.SEND, "hello", thinking=False, sampling=greedy(32)).wait(TIMEOUT)
    serving = ServingEngine(engine, ServingOptions(pool_bytes=0))
    try:
        steps = serving.batch.steps
        threads = writes_on_threads(store)
        batched = model_for(engine, store)
        turn = batched.start(TurnKind.SEND, "hello", thinking=False, sampling=greedy(32))
        assert isinstance(turn.wait(TIMEOUT), Finished)
        assert serving.batch.steps > steps  # it ran in the API's batch
    finally:
        serving.close()
    assert threads and threading.main_thread() not in threads
    assert rows(store, batched.conversation_id) == rows(store, alone.conversation_id)


def test_the_recording_thread_runs_work_in_order_survives_a_failure_and_ends_when_idle(monkeypatch):
    from macapp.core import conversation as conv

    monkeypatch.setattr(conv, "IDLE_EXIT_S", 0.2)
    serial = conv._Serial("test-serial")
    done, ran_on = [], set()
    finished = threading.Event()

    def work(i):
        def run():
            ran_on.add(threading.current_thread().name)
            if i == 3:
                raise RuntimeError("a bug in one piece of work")
            done.append(i)
            if i == 9:
                finished.set()

        return run

    for i in range(10):
        serial.put(work(i), urgent=i % 2 == 0)
    assert finished.wait(60)
    assert done == [0, 1, 2, 4, 5, 6, 7, 8, 9] and ran_on == {"test-serial"}
    for _ in range(100):  # up to 5 s
        if not any(t.name == "test-serial" for t in threading.enumerate()):
            break
        threading.Event().wait(0.05)
    assert not any(t.name == "test-serial" for t in threading.enumerate())  # idle: gone
    again = threading.Event()
    serial.put(again.set)  # and started again for new work
    assert again.wait(60)
