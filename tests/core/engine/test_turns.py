"""Turn plans (macapp/core/engine/turns.py): what each kind of turn restores, feeds and undoes — no MLX involved."""

from __future__ import annotations

from dataclasses import replace

import pytest

from macapp.core import events as ev
from macapp.core.engine import EngineError
from macapp.core.engine.positions import SavedPosition
from macapp.core.engine.turns import (
    ThinkingMode,
    TurnMemory,
    TurnPlan,
    last_user_index,
    plan_redo,
    plan_send,
    require_text,
)
from macapp.core.events import TurnKind

BEFORE_TURN, BEFORE_LAST = SavedPosition(30, ()), SavedPosition(41, ())
CONVERSATION = [
    {"role": "user", "content": "first"},
    {"role": "assistant", "content": "one", "thinking": False},
    {"role": "user", "content": "second"},
    {"role": "assistant", "content": "two", "thinking": False},
]


@pytest.fixture(scope="module")
def tok(engine):
    return engine.model.tokenizer


def user_turn(tok, text, thinking):
    return list(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, enable_thinking=thinking))


def encode(tok, text):
    return list(tok.encode(text, add_special_tokens=False))


def memory(tok, mode=ThinkingMode.OFF):
    return TurnMemory(before_turn=BEFORE_TURN, close_before="\n", prefix=encode(tok, "\n"), before_last=BEFORE_LAST, last_token=123, mode=mode)


def test_the_thinking_mode_of_a_turn():
    assert [ThinkingMode.of(t, b) for t, b in [(False, None), (False, 0), (True, None), (True, 5), (True, 0)]] == [
        ThinkingMode.OFF,
        ThinkingMode.OFF,
        ThinkingMode.ON,
        ThinkingMode.ON,
        ThinkingMode.CLOSED,
    ]
    assert [m.thinking for m in ThinkingMode] == [False, True, True]


@pytest.mark.parametrize(
    "kind, restored, rereads, undo, keep",
    [
        (TurnKind.SEND, False, False, True, False),
        (TurnKind.REGENERATE, True, False, False, False),  # from a snapshot: reads on, never undone
        (TurnKind.REGENERATE, False, True, True, True),
        (TurnKind.EDIT, True, False, True, False),
        (TurnKind.EDIT, False, True, True, False),
    ],
)
def test_what_a_stop_while_reading_does_follows_from_the_kind_of_turn(kind, restored, rereads, undo, keep):
    plan = TurnPlan(
        kind=kind,
        mode=ThinkingMode.OFF,
        prompt=[1, 2],
        user_text="q",
        history=[],
        prefix=None,
        close_before="",
        restore=BEFORE_TURN if restored else None,
    )
    assert (plan.rereads, plan.undo_on_stop, plan.keeps_message_on_undo) == (rereads, undo, keep)


def test_a_send_appends_the_close_and_the_user_turn(tok):
    plan = plan_send(tok, text="next", mode=ThinkingMode.OFF, messages=CONVERSATION, system_prompt="sys", close_text="<|im_end|>\n")
    closing = encode(tok, "<|im_end|>\n")
    assert plan.kind is TurnKind.SEND and plan.prefix == closing and plan.prompt == closing + user_turn(tok, "next", False)
    assert (plan.history, plan.user_text, plan.close_before, plan.restore) == (CONVERSATION, "next", "<|im_end|>\n", None)
    closed = plan_send(tok, text="next", mode=ThinkingMode.CLOSED, messages=[], system_prompt=None, close_text="")
    assert closed.prompt == user_turn(tok, "next", True) + encode(tok, "</think>\n\n") and closed.prefix == []


def test_a_send_with_nothing_cached_reads_the_conversation_through_the_template(tok):
    plan = plan_send(tok, text="next", mode=ThinkingMode.ON, messages=CONVERSATION, system_prompt="sys", close_text=None)
    whole = [{"role": "system", "content": "sys"}, *CONVERSATION, {"role": "user", "content": "next"}]
    assert plan.prompt == list(tok.apply_chat_template(whole, add_generation_prompt=True, enable_thinking=True))
    assert plan.prefix + user_turn(tok, "next", True) == plan.prompt and plan.close_before == ""


def test_regenerate_in_the_same_mode_feeds_one_token_from_the_last_snapshot(tok):
    plan = plan_redo(tok, new_text=None, thinking=None, budget=None, messages=CONVERSATION, last_user=2, system_prompt=None, last=memory(tok))
    assert (plan.kind, plan.mode, plan.prompt, plan.user_text) == (TurnKind.REGENERATE, ThinkingMode.OFF, [123], "second")
    assert plan.restore is BEFORE_LAST and plan.turn_start is BEFORE_TURN and plan.history == CONVERSATION[:2]


def test_regenerate_in_another_mode_and_edit_go_back_before_the_user_turn(tok):
    other = plan_redo(tok, new_text=None, thinking=True, budget=None, messages=CONVERSATION, last_user=2, system_prompt=None, last=memory(tok))
    assert other.restore is BEFORE_TURN and other.prompt == encode(tok, "\n") + user_turn(tok, "second", True)
    assert not other.undo_on_stop
    closed = plan_redo(tok, new_text=None, thinking=True, budget=0, messages=CONVERSATION, last_user=2, system_prompt=None, last=memory(tok, ThinkingMode.ON))
    assert closed.mode is ThinkingMode.CLOSED and closed.prompt[-len(encode(tok, "</think>\n\n")) :] == encode(tok, "</think>\n\n")
    edit = plan_redo(tok, new_text="fixed", thinking=None, budget=None, messages=CONVERSATION, last_user=2, system_prompt=None, last=memory(tok))
    assert edit.kind is TurnKind.EDIT and edit.user_text == "fixed" and edit.restore is BEFORE_TURN and edit.undo_on_stop
    assert edit.prompt == encode(tok, "\n") + user_turn(tok, "fixed", False) and edit.close_before == "\n"


def test_without_a_snapshot_regenerate_and_edit_read_the_conversation_once(tok):
    for last in (None, replace(memory(tok), prefix=None)):
        plan = plan_redo(tok, new_text="fixed", thinking=None, budget=None, messages=CONVERSATION, last_user=2, system_prompt="sys", last=last)
        whole = [{"role": "system", "content": "sys"}, *CONVERSATION[:2], {"role": "user", "content": "fixed"}]
        assert plan.rereads and plan.restore is None and plan.close_before == ""
        assert plan.prompt == list(tok.apply_chat_template(whole, add_generation_prompt=True, enable_thinking=False))
    old_mode = plan_redo(tok, new_text=None, thinking=None, budget=None, messages=CONVERSATION[:3], last_user=2, system_prompt=None, last=None)
    assert old_mode.mode is ThinkingMode.ON  # no reply to take the mode from: thinking on


def test_nothing_to_answer_again_and_empty_messages_are_refused():
    for text in ("", "  \n"):
        with pytest.raises(EngineError) as err:
            require_text(text)
        assert err.value.code == ev.EMPTY_PROMPT
    with pytest.raises(EngineError) as err:
        last_user_index([{"role": "assistant", "content": "hi"}], None)
    assert err.value.code == ev.NOTHING_TO_REDO
    with pytest.raises(EngineError) as err:
        last_user_index(CONVERSATION, " ")
    assert err.value.code == ev.EMPTY_PROMPT
    assert last_user_index(CONVERSATION, None) == 2 and last_user_index(CONVERSATION[:1], "x") == 0
