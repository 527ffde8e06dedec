"""Rendering requests through the tiny model's Qwen3.5-like template (tools, calls, results, thinking)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from macapp.core.sampling import greedy
from macapp.core.serving.render import RenderError, render
from macapp.core.serving.requests import (
    ChatMessage,
    CompletionRequest,
    ImagePart,
    Role,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolSpec,
)

WEATHER = ToolSpec("get_weather", "forecast", {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}})
SYSTEM = ChatMessage(Role.SYSTEM, "You are a careful agent. " * 20)
USER = ChatMessage(Role.USER, "What is the weather in Paris?")


@pytest.fixture(scope="module")
def tokenizer(tiny_dense_path):
    from mlx_lm.tokenizer_utils import load

    return load(Path(tiny_dense_path))


def request(*messages: ChatMessage, **kw) -> CompletionRequest:
    kw.setdefault("tools", (WEATHER,))
    return CompletionRequest(messages=tuple(messages), sampling=greedy(), **kw)


def agent_round(i: int) -> tuple[ChatMessage, ChatMessage]:
    call = ToolCall(f"call_{i}", "get_weather", {"city": f"city{i}", "days": i})
    return ChatMessage(Role.ASSISTANT, "Checking." if i % 2 else "", tool_calls=(call,)), ChatMessage(Role.TOOL, f"sunny {i}", tool_call_id=f"call_{i}")


def test_calls_and_results_render_in_the_templates_format(tokenizer):
    call, result = agent_round(3)
    p = render(tokenizer, request(SYSTEM, USER, call, result))
    assert "<tools>\n" in p.text and '"name": "get_weather"' in p.text
    assert (
        "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\ncity3\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
        in p.text
    )
    assert "<|im_start|>user\n<tool_response>\nsunny 3\n</tool_response><|im_end|>" in p.text
    assert p.tokens == list(tokenizer.encode(p.text, add_special_tokens=False))
    assert p.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and not p.thinking and p.prefill == ""


def test_thinking_on_opens_the_think_block_and_budget_zero_is_off(tokenizer):
    on = render(tokenizer, request(USER, thinking=True))
    assert on.thinking and on.text.endswith("<|im_start|>assistant\n<think>\n")
    off = render(tokenizer, request(USER, thinking=True, thinking_budget=0))
    assert not off.thinking and off.tokens == render(tokenizer, request(USER)).tokens


def test_reasoning_sent_back_is_kept_after_the_last_user_turn(tokenizer):
    call, result = agent_round(1)
    call = ChatMessage(Role.ASSISTANT, call.content, reasoning="I need the forecast.", tool_calls=call.tool_calls)
    p = render(tokenizer, request(USER, call, result, thinking=True))
    assert "<|im_start|>assistant\n<think>\nI need the forecast.\n</think>\n\nChecking." in p.text
    later = render(tokenizer, request(USER, call, result, ChatMessage(Role.USER, "And Rome?")))
    assert "I need the forecast." not in later.text  # the template drops it once a new user query comes


def test_tool_choice_none_offers_no_tools(tokenizer):
    p = render(tokenizer, request(USER, tool_choice=ToolChoice(ToolChoiceMode.NONE)))
    assert "<tools>" not in p.text and p.tools == ()
    assert render(tokenizer, request(USER)).tools == (WEATHER,)


def test_forced_calls_prefill_the_reply_without_reasoning(tokenizer):
    named = render(tokenizer, request(USER, thinking=True, tool_choice=ToolChoice(ToolChoiceMode.FUNCTION, "get_weather")))
    assert named.prefill == "<tool_call>\n<function=get_weather>\n" and not named.thinking
    assert named.text.endswith("</think>\n\n" + named.prefill)
    required = render(tokenizer, request(USER, tool_choice=ToolChoice(ToolChoiceMode.REQUIRED)))
    assert required.text.endswith("</think>\n\n<tool_call>\n<function=")
    with pytest.raises(RenderError, match="'nope'"):
        render(tokenizer, request(USER, tool_choice=ToolChoice(ToolChoiceMode.FUNCTION, "nope")))
    with pytest.raises(RenderError, match="no tools"):
        render(tokenizer, request(USER, tools=(), tool_choice=ToolChoice(ToolChoiceMode.REQUIRED)))


def test_bad_requests_raise_a_clear_render_error(tokenizer):
    with pytest.raises(RenderError, match="no messages"):
        render(tokenizer, request())
    # pictures are rendered as image parts and handed on (macapp.core.serving.pictures reads and checks them)
    picture = ImagePart(b"\x89PNG")
    assert render(tokenizer, request(ChatMessage(Role.USER, "look", images=(picture,)))).images == (picture,)
    bad = ChatMessage(Role.ASSISTANT, "", tool_calls=(ToolCall("c", "get_weather", "not a mapping"),))  # type: ignore[arg-type]
    with pytest.raises(RenderError, match="chat template"):
        render(tokenizer, request(USER, bad, ChatMessage(Role.TOOL, "x")))


def test_boundaries_are_every_turn_start_and_the_last_token(tokenizer):
    call, result = agent_round(1)
    p = render(tokenizer, request(SYSTEM, USER, call, result))
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert p.boundaries == tuple(sorted(p.boundaries)) and p.boundaries[-1] == len(p.tokens) - 1
    turn_starts = [b for b in p.boundaries[:-1] if p.tokens[b] == start]
    assert all(tokenizer.decode(p.tokens[:b]).endswith("</tool_response>") for b in p.boundaries[:-1] if b not in turn_starts)
    after_system, before_call, before_results, before_reply = turn_starts
    assert tokenizer.decode(p.tokens[before_results:]).startswith("<|im_start|>user\n<tool_response>")
    assert p.text.count("<|im_start|>") == 5  # system, user, assistant, tool results, generation prompt
    assert tokenizer.decode(p.tokens[after_system:]).startswith("<|im_start|>user\nWhat is")
    assert tokenizer.decode(p.tokens[before_call:]).startswith("<|im_start|>assistant\n<think>\n\n</think>\n\nChecking.")
    assert tokenizer.decode(p.tokens[before_reply:]) == "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_boundaries_are_at_the_ends_of_reminder_and_tool_result_blocks_and_every_period(tokenizer):
    """Claude Code's first message: reminders, then the user's words; a tool turn of two results. A checkpoint
    after each block, so a second session with other words reuses the reminders; and one every PERIOD tokens."""
    from macapp.core.serving.render import PERIOD

    reminder = "<system-reminder>\nThe date is today. Files: a, b, c.\n</system-reminder>\n"
    call = ChatMessage(Role.ASSISTANT, "", tool_calls=(ToolCall("c1", "get_weather", {"city": "Paris"}), ToolCall("c2", "get_weather", {"city": "Rome"})))
    results = (ChatMessage(Role.TOOL, "sunny", tool_call_id="c1"), ChatMessage(Role.TOOL, "rain", tool_call_id="c2"))
    prompts = [render(tokenizer, request(SYSTEM, ChatMessage(Role.USER, reminder * 2 + words), call, *results)) for words in ("say hi", "list files")]
    for p in prompts:
        cut = [tokenizer.decode(p.tokens[:b]) for b in p.boundaries]
        assert sum(c.endswith("</system-reminder>") for c in cut) == 2  # after each reminder block
        assert sum(c.endswith("</tool_response>") for c in cut) == 2  # after each tool result
    a, b = prompts
    after_reminders = max(x for x in a.boundaries if tokenizer.decode(a.tokens[:x]).endswith("</system-reminder>"))
    assert after_reminders in b.boundaries and a.tokens[:after_reminders] == b.tokens[:after_reminders]
    assert a.tokens[after_reminders] != b.tokens[after_reminders] or a.tokens[after_reminders + 1] != b.tokens[after_reminders + 1]
    long = render(tokenizer, request(ChatMessage(Role.USER, "word " * (2 * PERIOD + 100))))
    assert {PERIOD, 2 * PERIOD} <= set(long.boundaries)


@pytest.mark.parametrize("thinking", [False, True])
def test_each_rounds_turn_starts_are_token_prefixes_of_the_next_round(tokenizer, thinking):
    """In an agent loop the previous prompt up to its reply is a token prefix of the next prompt."""
    messages = [SYSTEM, USER]
    previous = render(tokenizer, request(*messages, thinking=thinking))
    for i in range(1, 5):
        messages += agent_round(i)
        p = render(tokenizer, request(*messages, thinking=thinking))
        for b in previous.boundaries[:-1]:
            assert p.tokens[:b] == previous.tokens[:b]
        before_reply = previous.boundaries[-2]
        assert tokenizer.decode(p.tokens[before_reply:]).startswith("<|im_start|>assistant\n")
        previous = p
    other = render(tokenizer, request(SYSTEM, ChatMessage(Role.USER, "Something else entirely")))
    assert other.tokens[: other.boundaries[0]] == previous.tokens[: previous.boundaries[0]]  # same system + tools


STRICT_SYSTEM = (
    "{%- for m in messages %}{%- if m.role == 'system' and not loop.first %}"
    "{{- raise_exception('System message must be at the beginning.') }}{%- endif %}{%- endfor %}"
)


@pytest.fixture
def strict_tokenizer(tiny_dense_path):
    """The tiny template with Qwen3.5's own check: a system message anywhere but first is an error."""
    from mlx_lm.tokenizer_utils import load

    from macapp.core.demo.tiny_model import CHAT_TEMPLATE

    tok = load(Path(tiny_dense_path))
    tok._tokenizer.chat_template = STRICT_SYSTEM + CHAT_TEMPLATE
    return tok


def test_a_late_system_message_becomes_a_user_turn_in_place(strict_tokenizer):
    """Claude Code sends hook context as a system message after the first user turn; OpenAI clients a late developer one."""
    hook = ChatMessage(Role.SYSTEM, "<system-reminder>hook output</system-reminder>")
    call, result = agent_round(1)
    p = render(strict_tokenizer, request(SYSTEM, USER, hook, call, result))
    as_user = render(strict_tokenizer, request(SYSTEM, USER, replace(hook, role=Role.USER), call, result))
    assert p.tokens == as_user.tokens
    assert p.text.count("<|im_start|>system") == 1 and p.text.startswith("<|im_start|>system")
    with pytest.raises(Exception, match="System message must be at the beginning"):  # the template as is refuses it
        strict_tokenizer.apply_chat_template([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}], tokenize=False)


def test_leading_system_messages_are_joined_into_one(strict_tokenizer):
    developer = ChatMessage(Role.SYSTEM, "Answer in French.")
    p = render(strict_tokenizer, request(SYSTEM, developer, USER))
    assert p.text.count("<|im_start|>system") == 1
    assert SYSTEM.content + "\n\n" + developer.content in p.text
    assert (
        p.tokens[: p.boundaries[0]]
        == render(strict_tokenizer, request(replace(SYSTEM, content=SYSTEM.content + "\n\n" + developer.content), USER)).tokens[: p.boundaries[0]]
    )


def test_continuing_a_reply_writes_its_start_after_the_generation_prompt(tokenizer):
    start = ChatMessage(Role.ASSISTANT, "The best answer is (")
    p = render(tokenizer, request(USER, start, continue_reply=True, thinking=True))
    fresh = render(tokenizer, request(USER, thinking=False))
    assert p.text == fresh.text + start.content and p.prefill == start.content and not p.thinking
    assert render(tokenizer, request(USER, start)).text.count("<|im_start|>assistant") == 2  # without it: a finished turn
    with pytest.raises(RenderError, match="user message before it"):
        render(tokenizer, request(start, continue_reply=True))


def test_allowed_tools_are_the_only_ones_offered(tokenizer):
    clock = ToolSpec("get_time", "time", {"type": "object", "properties": {"city": {"type": "string"}}})
    p = render(tokenizer, request(USER, tools=(WEATHER, clock), tool_choice=ToolChoice(ToolChoiceMode.REQUIRED, allowed=("get_time",))))
    assert [t.name for t in p.tools] == ["get_time"] and '"get_weather"' not in p.text
    assert p.prefill == "<tool_call>\n<function="
    with pytest.raises(RenderError, match="offers no tools"):
        render(tokenizer, request(USER, tools=(WEATHER,), tool_choice=ToolChoice(ToolChoiceMode.REQUIRED, allowed=())))
