"""Stop sequences on streamed text: the same cut however the text is split."""

from __future__ import annotations

import pytest

from macapp.core.serving.stops import StopMatcher, partial_suffix

CASES = [
    ("The answer is here!", (" is",), "The answer", " is"),
    ("The answer is here!", ("here", "answer"), "The ", "answer"),
    ("The answer is here!", ("er", "answer"), "The ", "answer"),  # the earliest match wins, the longest at a tie
    ("The answer is here!", ("nope",), "The answer is here!", None),
    ("The answer is her", ("here!",), "The answer is her", None),  # a partial match at the end is text
    ("abc", (), "abc", None),
    ("abc", ("",), "abc", None),
    ("line one\n\nline two", ("\n\n",), "line one", "\n\n"),
]


@pytest.mark.parametrize("text,stops,expected,matched", CASES)
def test_any_split_cuts_at_the_first_stop(text, stops, expected, matched):
    for size in (1, 2, 3, len(text)):
        m = StopMatcher(stops)
        out = "".join(m.feed(text[i : i + size]) for i in range(0, len(text), size)) + m.flush()
        assert (out, m.matched) == (expected, matched), size


def test_nothing_after_a_match():
    m = StopMatcher(["STOP"])
    assert m.feed("go ST") == "go "
    assert m.feed("OP and more") == ""
    assert m.feed("still more") == "" and m.flush() == "" and m.matched == "STOP"


def test_partial_suffix():
    assert partial_suffix("abc<tool", "<tool_call>") == 5
    assert partial_suffix("abc", "<tool_call>") == 0
    assert partial_suffix("<tool_call>", "<tool_call>") == 0  # a whole tag is not a partial one
