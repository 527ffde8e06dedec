"""A saved tool turn back as the session held it (tools.rounds), without a model: the rounds' own text, their
results (a denied call's message), the answer; the round bound's note is not a round; older records give None;
a redo folds the rounds away."""

from __future__ import annotations

from macapp.core.events import ToolCallRecord
from macapp.core.tools.rounds import DENIED, ROUNDS_REASON, session_rounds, tool_responses, without_rounds

CALL = "I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
TWO = "<tool_call>\n<function=a>\n</function>\n</tool_call>\n<tool_call>\n<function=b>\n</function>\n</tool_call>"


def call(name: str, result: str | None, round: int, at: int, said: str) -> dict[str, object]:
    return ToolCallRecord("s", name, {}, result is not None, result, round=round, at=at, said=said).to_json()


def test_rounds_come_back_as_the_session_held_them():
    content = "I will check.\n\nNow both.\n\nDone: sunny."  # round 1's text, round 2's (calls only after it), the answer
    calls = [
        call("get_weather", "Sunny.", 1, 13, CALL),
        call("a", None, 2, 24, "Now both.\n\n" + TWO),
        call("b", "B.", 2, 24, "Now both.\n\n" + TWO),
    ]
    assert session_rounds(content, "stop", calls) == [
        {"role": "assistant", "content": CALL},
        {"role": "user", "content": tool_responses(["Sunny."])},
        {"role": "assistant", "content": "Now both.\n\n" + TWO},
        {"role": "user", "content": tool_responses([DENIED, "B."])},
        {"role": "assistant", "content": "Done: sunny."},
    ]


def test_the_round_bounds_note_is_not_a_round_and_old_records_give_none():
    content = "I will check.\n\n[Stopped after 1 round of tool calls: the model kept calling tools. Ask again to go on.]"
    calls = [call("get_weather", "Sunny.", 1, 13, CALL)]
    assert session_rounds(content, ROUNDS_REASON, calls) == [{"role": "assistant", "content": CALL}]  # its results never sent
    assert session_rounds("I will check.", "stopped", calls) == [{"role": "assistant", "content": CALL}]  # stopped while asking
    old = [ToolCallRecord("s", "get_weather", {}, True, "Sunny.").to_json()]  # saved before rounds were kept
    assert session_rounds("I will check.", "stop", old) is None and session_rounds("Hi", "stop", []) is None


def test_a_redo_folds_the_last_exchanges_rounds():
    held = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": CALL},
        {"role": "user", "content": tool_responses(["Sunny."])},
        {"role": "assistant", "content": "It is sunny."},
    ]
    assert without_rounds(held) == [held[0], held[3]]
    assert without_rounds(held[:1] + held[3:]) == held[:1] + held[3:]  # nothing to fold
