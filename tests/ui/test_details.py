"""The details pane's text helpers: the ways out as the label shows them, durations kept on one line."""

from __future__ import annotations

from macapp.ui.details import _unbroken, advice_html


def test_the_ways_out_show_commands_as_code_and_escape_the_rest():
    text = advice_html(["Too big: 24.8 GB > 19.1 GB.", "1. run `sudo sysctl iogpu.wired_limit_mb=20480` in Terminal <now>."])
    head, steps = text.split("</p>", 1)
    assert "Too big: 24.8 GB &gt; 19.1 GB." in head
    assert steps == "1. run <code>sudo sysctl iogpu.wired_limit_mb=20480</code> in Terminal &lt;now&gt;."
    assert advice_html([]) == ""


def test_a_duration_does_not_break_across_lines():
    assert _unbroken("8 min 44 s") == "8\u00a0min\u00a044\u00a0s"
