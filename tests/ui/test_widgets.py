"""The streaming Markdown view: where the finished part of a growing text ends, and incremental = full render."""

from __future__ import annotations

import pytest

from macapp.ui.widgets import MarkdownView, stable_prefix_end

FENCE = "```"


@pytest.mark.parametrize(
    "text,end",
    [
        ("", 0),
        ("one line, still growing", 0),
        ("para\n\nnext", 6),  # after the blank line
        ("para\n\n", 0),  # a trailing blank line: more may follow it in the same block
        ("a\n\nb\n\nc", 6),  # the last blank line counts
        ("a\n   \nb", 6),  # a line of spaces is blank
        ("a\r\n\r\nb", 5),
        ("two\nlines\n\nnext", 11),
        (f"{FENCE}\ncode\n\nmore\n{FENCE}\n\nafter", 20),  # blank lines inside a fence do not end a block
        (f"intro\n\n{FENCE}py\ncode\n\nstill code", 7),  # an open fence: only what came before it
        ("intro\n\n~~~\nx\n\ny\n~~~\n\nz", 21),  # tilde fences too
        (f"{FENCE}\nopen\n\n", 0),
    ],
)
def test_stable_prefix_end(text, end):
    assert stable_prefix_end(text) == end


TEXTS = [
    "Intro with **bold**.\n\nSecond para\nover two lines.\n\n```python\nx = 1\n\ny = 2\n```\n\n- a\n- b\n\nEnd `code`.",
    "# Title\n\nSome *text*.\n\n1. one\n2. two\n\n> a quote\n\nlast",
    "> quoted first\n\n## Heading two\n\ntext **b**\n\n~~~\nfenced\n~~~\n\ntail",
    "Intro\n\n- a\n- b\n\nafter",
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("step", [1, 7])
def test_the_incremental_render_ends_equal_to_a_full_render(qtbot, text, step):
    streamed, full = MarkdownView(), MarkdownView()
    qtbot.addWidget(streamed)
    qtbot.addWidget(full)
    for i in range(step, len(text), step):
        streamed.stream_markdown(text[:i])
    streamed.stream_markdown(text)
    full.set_markdown(text)
    assert streamed.toMarkdown() == full.toMarkdown()
    # Block for block and format for format, before the finishing set_markdown (no stray empty paragraph
    # before a list, no fence, quote or heading losing its format).
    assert streamed.document().toHtml() == full.document().toHtml()
    assert streamed.source_text == text and streamed.renders == len(range(step, len(text), step)) + 1
    streamed.set_markdown(text)  # what a finished reply ends with: exactly the full render
    assert streamed.document().toHtml() == full.document().toHtml()
