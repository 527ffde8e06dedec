"""Chat sessions on an engine with a disk shelf (Engine.position_shelf, the disk store): the turns, a regenerate, an
edit and a stop while reading go exactly as without one, and a conversation reopened on a fresh engine (a
restart) starts from the disk's positions, its cache the one a whole read gives."""

from __future__ import annotations

import threading

import pytest

from macapp.core.engine import Engine
from macapp.core.events import Finished, PromptProgress
from macapp.core.prompt_disk import DiskStore
from macapp.core.prompt_disk.shelf import shelves
from macapp.core.sampling import greedy
from tests.core.engine.helpers import EXACT, TIMEOUT, cache_error


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
