"""The streaming reasoning/answer splitter (pure; no model)."""

from __future__ import annotations

import random

import pytest

from macapp.core.thinking import ANSWER, REASONING, ThinkingSplitter


def _run(pieces, in_reasoning):
    s = ThinkingSplitter(in_reasoning=in_reasoning)
    out = []
    for p in pieces:
        out += s.feed(p)
    out += s.flush()
    reasoning = "".join(t for k, t in out if k == REASONING)
    answer = "".join(t for k, t in out if k == ANSWER)
    assert reasoning == s.reasoning_text and answer == s.answer_text
    return reasoning, answer, out


def test_thinking_stream_starts_inside_reasoning_and_ends_at_the_tag():
    reasoning, answer, out = _run(["Let me", " think.", "\n</think>", "\n\n", "The answer", "."], True)
    assert reasoning == "Let me think."
    assert answer == "The answer."
    kinds = [k for k, _ in out]
    assert kinds == sorted(kinds, key=lambda k: k == ANSWER)  # all reasoning pieces come first


@pytest.mark.parametrize("cut", range(1, len("</think>")))
def test_a_tag_split_across_pieces_is_recognised(cut):
    tag = "</think>"
    reasoning, answer, _ = _run(["abc", tag[:cut], tag[cut:], "\n\nxyz"], True)
    assert (reasoning, answer) == ("abc", "xyz")


def test_every_split_of_a_whole_reply_gives_the_same_texts():
    text = "step one\nstep two\n</think>\n\nfinal <b>answer</b>\nwith </thi lookalike"
    expected = _run([text], True)[:2]  # the whole reply in one piece
    assert expected == ("step one\nstep two", "final <b>answer</b>\nwith </thi lookalike")
    rng = random.Random(1)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 12)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert _run(pieces, True)[:2] == expected


def test_a_reply_that_never_closes_its_reasoning_is_all_reasoning():
    reasoning, answer, _ = _run(["I keep", " thinking", " and </th"], True)
    assert reasoning == "I keep thinking and </th"  # a half tag at the end is text after all
    assert answer == ""


def test_thinking_off_is_all_answer_and_drops_leading_blank_lines():
    reasoning, answer, _ = _run(["\n", "\nHello", " world", "\n"], False)
    assert (reasoning, answer) == ("", "Hello world\n")


def test_a_model_that_opens_its_own_think_tag_is_split_too():
    reasoning, answer, _ = _run(["<thi", "nk>\nhmm", "</think>\n\nok"], False)
    assert (reasoning, answer) == ("hmm", "ok")


def test_newlines_inside_reasoning_are_kept_but_not_before_the_tag():
    reasoning, answer, _ = _run(["a\n", "\nb\n", "\n", "</think>", "c"], True)
    assert (reasoning, answer) == ("a\n\nb", "c")


def test_a_stray_closing_tag_in_the_answer_is_dropped():
    assert _run(["x</think>y"], False)[:2] == ("", "xy")
