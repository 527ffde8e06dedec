"""Chat sessions on an engine with a disk shelf (Engine.position_shelf, the disk store): the turns, a regenerate, an
edit and a stop while reading go exactly as without one, and a conversation reopened on a fresh engine (a
restart) starts from the disk's positions, its cache the one a whole read gives."""

from __future__ import annotations

import logging
import threading

import pytest

from macapp.core.engine import Engine
from macapp.core.events import Finished, PromptProgress, TurnKind
from macapp.core.history import Role, Store
from macapp.core.prompt_disk import DiskStore
from macapp.core.prompt_disk.shelf import shelves
from macapp.core.recorder import ChatRecorder, TurnResult
from macapp.core.sampling import greedy
from tests.core.engine.helpers import ANSWER, EXACT, TIMEOUT, cache_error, template


@pytest.fixture
def shelved(tiny_moe_path, tmp_path):
    """`shelved()`: a fresh engine (a new process, as it were) on the tiny MoE, its sessions keeping positions in
    one disk store at tmp_path."""
    made: list[tuple[Engine, DiskStore]] = []

    def make() -> tuple[Engine, DiskStore]:
        e, store = Engine(), DiskStore(tmp_path, 10**9, 0)
        e.position_shelf = shelves(store)
        e.load(str(tiny_moe_path)).result(timeout=TIMEOUT)
        made.append((e, store))
        return e, store

    yield make
    for e, store in made:
        e.close()
        store.close()


def test_turns_regenerate_edit_and_a_reopened_conversation_match_an_engine_without_a_shelf(engine, shelved, off_script):
    plain = engine.new_session(system_prompt="sys")
    e, store = shelved()
    s = e.new_session(system_prompt="sys")
    for session in (plain, s):
        session.send("first", thinking=True, sampling=greedy(40)).result(timeout=TIMEOUT)
    replies = []
    for session in (plain, s):
        replies.append(
            [
                session.send("a question with a typo", thinking=False, sampling=off_script).result(timeout=TIMEOUT).token_ids,
                session.regenerate(sampling=off_script).result(timeout=TIMEOUT).token_ids,
                session.edit_last("a question, fixed", sampling=off_script).result(timeout=TIMEOUT).token_ids,
            ]
        )
    assert replies[0] == replies[1] and s.tokens == plain.tokens and cache_error(e, s) < EXACT
    store.flush()
    assert store.written > 0
    again, _ = shelved()  # a restart: the conversation reopened from its messages
    reopened = again.new_session(system_prompt="sys", messages=s.messages)
    cold = engine.new_session(system_prompt="sys", messages=s.messages)
    warm_reply = reopened.send("and more", thinking=False, sampling=off_script).result(timeout=TIMEOUT)
    cold_reply = cold.send("and more", thinking=False, sampling=off_script).result(timeout=TIMEOUT)
    assert warm_reply.token_ids == cold_reply.token_ids and reopened.tokens == cold.tokens
    assert warm_reply.stats.prompt_tokens < cold_reply.stats.prompt_tokens  # the start came back from disk
    assert cache_error(again, reopened) < EXACT
    edited = reopened.edit_last("and more, please", sampling=off_script).result(timeout=TIMEOUT)  # back past the restored start
    reference = cold.edit_last("and more, please", sampling=off_script).result(timeout=TIMEOUT)
    assert edited.token_ids == reference.token_ids and reopened.tokens == cold.tokens


def test_a_stop_while_reading_undoes_the_turn_with_a_shelf(shelved):
    e, _store = shelved()
    s = e.new_session()
    s.send("first", thinking=False, sampling=greedy(8)).result(timeout=TIMEOUT)
    before = list(s.tokens)
    job = s.send("word " * 600, thinking=False, sampling=greedy(8))
    reading = threading.Event()
    job.add_listener(lambda ev: reading.set() if isinstance(ev, PromptProgress) and ev.processed > 0 else None)
    reading.wait(TIMEOUT)
    job.stop()
    done = [ev for ev in job.events(timeout=TIMEOUT) if isinstance(ev, Finished)][-1]
    assert done.reply.finish_reason == "stopped" and not done.reply.kept
    job.join(timeout=TIMEOUT)  # the early Finished comes before the worker undoes the turn
    assert s.tokens == before and cache_error(e, s) < EXACT


def _recorded(recorder, session, text, **options):
    """One send of `session`, recorded into the history as the window and `qwen-desk chat` record it."""
    turn = recorder.begin(TurnKind.SEND, text, thinking=options.get("thinking", False))
    job = session.send(text, **options)
    for event in job.events(timeout=TIMEOUT):
        turn.feed(event)
    assert turn.outcome is not None and turn.outcome.result is TurnResult.COMPLETE
    return turn.outcome.reply


def test_a_conversation_reopened_after_a_restart_reads_only_its_new_message(shelved, tmp_path, caplog):
    """Three turns with thinking on (the second's reasoning cut by a budget, the third's closed by the prompt), saved
    in the history; after a restart the conversation, reopened from its messages or from the history (as the
    window and `chat --resume` reopen it), finds the position its session left after the last reply and reads only
    the new message: its reply and its cache are the still-open session's own for the same message."""
    caplog.set_level(logging.INFO, logger="macapp.core.engine.session")
    e, store = shelved()
    history = Store.open(tmp_path / "history.sqlite3")
    recorder = ChatRecorder(history, model="tiny", system_prompt="sys")
    live = e.new_session(system_prompt="sys")
    for text, budget in (("first", None), ("second", 3), ("third", 0)):
        _recorded(recorder, live, text, thinking=True, sampling=greedy(40), thinking_budget=budget)
    saved = history.get_conversation(recorder.conversation_id)
    replies = [m for m in saved.messages if m.role is Role.ASSISTANT]
    assert [m.cache_tokens for m in replies] == [tuple(m["cache_tokens"]) for m in live.messages if m["role"] == "assistant"]
    assert replies[1].stats.reasoning_tokens == 3 and replies[2].reasoning == "" and replies[2].content == ANSWER  # cut; closed
    store.flush()
    reopenings = {
        "messages": lambda engine: engine.new_session(system_prompt="sys", messages=live.messages),
        "history": lambda engine: engine.new_session(system_prompt=saved.system_prompt, messages=saved.chat_messages(include_system=False)),
    }
    for (way, reopen), (text, redo) in zip(reopenings.items(), (("fourth", live.send), ("fourth, again", live.edit_last))):
        again, _ = shelved()  # a restart: a new engine, the same disk
        reopened = reopen(again)
        reply = reopened.send(text, thinking=True, sampling=greedy(40)).result(timeout=TIMEOUT)
        reference = redo(text, thinking=True, sampling=greedy(40)).result(timeout=TIMEOUT)
        new_message = 1 + len(template(e, [{"role": "user", "content": text}], True))  # "\n" after <|im_end|>, then the turn
        assert reply.stats.prompt_tokens == reference.stats.prompt_tokens == new_message, way
        assert reply.token_ids == reference.token_ids and reply.text == ANSWER and reopened.tokens == live.tokens, way
        assert reply.stats.context_tokens == reference.stats.context_tokens and cache_error(again, reopened) < EXACT, way
        held = reply.stats.context_tokens - reply.stats.prompt_tokens - reply.stats.generation_tokens
        assert f"reuses {held} of its {held + new_message} prompt tokens from disk" in caplog.text, way  # the log says so
    history.close()


def test_a_reopened_conversation_whose_saved_tokens_are_missing_reads_more_and_stays_exact(engine, shelved, tmp_path):
    """A history from before the tokens were saved (or another tokenizer's, or a tool turn's): each reply is read
    again as its text, so the reopened prompt parts from the cache the session left at its first reply; what
    comes back from disk is reused, the rest is read, and the reply is the one a whole read gives."""
    e, store = shelved()
    history = Store.open(tmp_path / "history.sqlite3")
    recorder = ChatRecorder(history, model="tiny", system_prompt="sys")
    live = e.new_session(system_prompt="sys")
    for text in ("first", "second"):
        _recorded(recorder, live, text, thinking=True, sampling=greedy(40))
    with history.database.write() as conn:
        conn.execute("UPDATE messages SET cache_tokens = NULL")  # as schema 5 left it
    messages = history.get_conversation(recorder.conversation_id).chat_messages(include_system=False)
    assert all("cache_tokens" not in m for m in messages)
    store.flush()
    again, _ = shelved()
    reopened = again.new_session(system_prompt="sys", messages=messages)
    cold = engine.new_session(system_prompt="sys", messages=messages)  # no shelf: the whole prompt is read
    warm_reply = reopened.send("third", thinking=True, sampling=greedy(40)).result(timeout=TIMEOUT)
    cold_reply = cold.send("third", thinking=True, sampling=greedy(40)).result(timeout=TIMEOUT)
    first_turn = template(e, [{"role": "system", "content": "sys"}, {"role": "user", "content": "first"}], True)
    # reused: the first turn's prompt but its last token (the position kept there), where the texts' tokens part
    assert warm_reply.stats.prompt_tokens == cold_reply.stats.prompt_tokens - (len(first_turn) - 1)
    assert warm_reply.token_ids == cold_reply.token_ids and reopened.tokens == cold.tokens != live.tokens[: len(cold.tokens)]
    assert cache_error(again, reopened) < EXACT
    history.close()


def test_a_reopened_conversation_whose_first_turn_is_a_regenerate_or_an_edit_reads_only_what_changed(shelved):
    """A Regenerate or an Edit as the first turn after a restart reads the conversation again from the shelf's longest
    position of it (the one its session left before its last reply, or after the reply before), as the still-open
    session goes back to its own marks: the same tokens read, the same reply, the same cache."""
    e, store = shelved()
    live = e.new_session(system_prompt="sys")
    for text in ("first", "second"):
        live.send(text, thinking=True, sampling=greedy(40)).result(timeout=TIMEOUT)
    saved = live.messages
    store.flush()
    for redo in (
        lambda s: s.regenerate(thinking=True, sampling=greedy(40)),
        lambda s: s.edit_last("second, put otherwise", thinking=True, sampling=greedy(40)),
    ):
        again, _ = shelved()  # a restart: a new engine, the same disk
        reopened = again.new_session(system_prompt="sys", messages=saved)
        reply = redo(reopened).result(timeout=TIMEOUT)
        reference = redo(live).result(timeout=TIMEOUT)
        assert reply.stats.prompt_tokens == reference.stats.prompt_tokens < 40  # not the whole conversation again
        assert reply.token_ids == reference.token_ids and reopened.tokens == live.tokens
        assert cache_error(again, reopened) < EXACT
        store.flush()
