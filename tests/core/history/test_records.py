"""The history's records: reply figures from the engine, titles from the first message, the engine's message shape."""

from __future__ import annotations

import pytest

from macapp.core.history import Conversation, Message, MessageState, ReplyStats, Role, title_from_text


def test_stats_come_from_the_engine_and_read_like_the_chat_command_line():
    from macapp.core.events import GenerationStats, format_stats

    engine_stats = GenerationStats(
        ttft_s=0.31,
        prompt_tokens=10,
        prompt_tps=100.0,
        generation_tokens=5,
        generation_tps=20.0,
        reasoning_tokens=2,
        peak_memory_bytes=1_500_000_000,
        context_tokens=532,
    )
    stats = ReplyStats.from_any(engine_stats)
    assert stats == ReplyStats(0.31, 10, 100.0, 5, 20.0, 2, 1_500_000_000, image_tokens=0)
    assert stats.summary() == ("prompt 10 tokens at 100.0 tok/s · generation 5 tokens at 20.0 tok/s · 2 reasoning · first token 0.31 s · peak 1.50 GB")
    assert format_stats(engine_stats) == stats.summary() + " · context 532"  # one formatter for the CLI and the history
    assert ReplyStats.from_any({"generation_tokens": 3}).summary() == "generation 3 tokens"
    assert ReplyStats.from_any({"prompt_tokens": 40, "image_tokens": 28}).summary() == "prompt 40 tokens · 28 image"


def test_stats_from_a_dict_are_typed_per_field():
    stats = ReplyStats.from_any({"prompt_tokens": 12.0, "ttft_s": 1, "ignored": "x"})
    assert stats.prompt_tokens == 12 and type(stats.prompt_tokens) is int
    assert stats.ttft_s == 1.0 and type(stats.ttft_s) is float
    assert not stats.is_empty() and ReplyStats.from_any(None).is_empty()


@pytest.mark.parametrize(
    "text, title",
    [
        ("  Hello   world \n second line", "Hello world"),
        ("\n\n```python\nprint(1)\n```\nWhy does this fail?", "print(1)"),
        ("# Plan a trip to Kyoto", "Plan a trip to Kyoto"),
        ("word " * 40, ("word " * 11).strip() + "…"),
        ("x" * 100, "x" * 59 + "…"),
        ("   ", ""),
    ],
)
def test_titles_from_the_first_message(text, title):
    result = title_from_text(text)
    assert result == title
    assert len(result) <= 60 and "\n" not in result


def test_chat_messages_reopen_a_conversation_in_the_engine_shape():
    conv = Conversation(
        id=1,
        title="",
        model="m",
        created=0,
        updated=0,
        system_prompt="Be brief.",
        messages=[
            Message(1, 1, 0, "user", "hi"),
            Message(2, 1, 1, "assistant", "hello", reasoning="greet", thinking=True, finish_reason="stop"),
        ],
    )
    assert conv.display_title == "New chat"
    assert conv.chat_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "reasoning": "greet", "thinking": True, "finish_reason": "stop"},
    ]
    assert conv.chat_messages(include_system=False)[0] == {"role": "user", "content": "hi"}


def test_roles_and_states_are_typed_and_read_like_their_names():
    m = Message(1, 1, 0, "assistant", "x", state="stopped")
    assert m.role is Role.ASSISTANT and m.state is MessageState.STOPPED and m.stopped
    assert m.role == "assistant" and f"{m.state}" == "stopped"  # what the database and the export hold
    with pytest.raises(ValueError):
        Message(1, 1, 0, "tool", "x")
