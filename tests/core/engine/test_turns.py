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
    held_reply,
    held_tokens,
    last_user_index,
    plan_redo,
    plan_send,
    replay,
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


def first_turn(tok, text, thinking, system="sys"):
    return list(
        tok.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": text}], add_generation_prompt=True, enable_thinking=thinking
        )
    )


def by_letter(tok, text):
    """`text` in other tokens than encode gives: one character at a time (the same text when decoded)."""
    return [t for c in text for t in encode(tok, c)]


def test_a_send_with_nothing_cached_reads_the_conversation_as_its_session_held_it(tok):
    """Turn by turn, as plan_send appended it: the first message through the template with the system prompt, each
    reply (no tokens saved: its text, closed by <|im_end|>), its close text, the next user turn."""
    plan = plan_send(tok, text="next", mode=ThinkingMode.ON, messages=CONVERSATION, system_prompt="sys", close_text=None)
    held = first_turn(tok, "first", False) + encode(tok, "one<|im_end|>") + encode(tok, "\n") + user_turn(tok, "second", False) + encode(tok, "two<|im_end|>")
    assert plan.prefix == held + encode(tok, "\n") and plan.prompt == plan.prefix + user_turn(tok, "next", True) and plan.close_before == ""
    assert replay(tok, "sys", CONVERSATION) == (held, "\n")
    # a reply with reasoning, no tokens saved: in the template's form
    thought = [*CONVERSATION[:1], {"role": "assistant", "content": "one", "reasoning": "why", "thinking": True}]
    assert replay(tok, None, thought) == (user_turn(tok, "first", True) + encode(tok, "why\n</think>\n\none<|im_end|>"), "\n")


def test_a_reply_is_read_again_in_its_saved_tokens_when_they_say_what_it_says(tok):
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    said = by_letter(tok, "why") + encode(tok, "</think>\n\n") + by_letter(tok, "one") + [im_end]
    assert said != encode(tok, "why</think>\n\none<|im_end|>")  # other tokens for the same text
    reply = {"role": "assistant", "content": "one", "reasoning": "why", "thinking": True, "cache_tokens": said}
    assert held_reply(tok, reply) == (said, "\n")
    cut = {**reply, "content": "", "cache_tokens": by_letter(tok, "why")}  # stopped while reasoning: closed as live
    assert held_reply(tok, cut) == (by_letter(tok, "why"), "\n</think>\n\n<|im_end|>\n")
    answer_cut = {**reply, "cache_tokens": said[:-1]}  # stopped in the answer
    assert held_reply(tok, answer_cut) == (said[:-1], "<|im_end|>\n")
    for wrong in ([*said[:-2], im_end], encode(tok, "other</think>\n\none<|im_end|>")):  # they say something else
        assert held_reply(tok, {**reply, "cache_tokens": wrong}) == (encode(tok, "why\n</think>\n\none<|im_end|>"), "\n")
    plan = plan_send(tok, text="next", mode=ThinkingMode.OFF, messages=[CONVERSATION[0], reply], system_prompt="sys", close_text=None)
    assert plan.prefix == first_turn(tok, "first", True) + said + encode(tok, "\n")


def test_a_turn_holds_a_closed_prompts_closing_tag_then_what_its_reply_added(tok):
    closing = encode(tok, "</think>\n\n")
    assert held_tokens(tok, ThinkingMode.ON, [5, 6, 7]) == held_tokens(tok, ThinkingMode.OFF, [5, 6, 7]) == [6, 7]  # after the prompt's last token
    assert held_tokens(tok, ThinkingMode.CLOSED, [closing[-1], 6, 7]) == closing + [6, 7]


def test_a_conversation_not_made_turn_by_turn_reads_through_the_template(tok):
    plain = [{"role": m["role"], "content": m["content"]} for m in CONVERSATION]  # no thinking flags: not a session's
    for messages in (plain, CONVERSATION[1:], CONVERSATION[:1] + CONVERSATION[:1]):
        plan = plan_send(tok, text="next", mode=ThinkingMode.ON, messages=messages, system_prompt="sys", close_text=None)
        whole = [{"role": "system", "content": "sys"}, *messages, {"role": "user", "content": "next"}]
        assert plan.prompt == list(tok.apply_chat_template(whole, add_generation_prompt=True, enable_thinking=True))
        assert replay(tok, "sys", messages) is None


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
        assert plan.rereads and plan.restore is None and plan.close_before == ""
        assert plan.prompt == first_turn(tok, "first", False) + encode(tok, "one<|im_end|>") + encode(tok, "\n") + user_turn(tok, "fixed", False)
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
