"""The tool loop with a model that reads its tool's result: the tiny scripted Qwen3.5 of
`scripted_answering_tool_path` calls `get_weather(city="Paris", days=3)` while its prompt holds no
<tool_response> and answers once it holds one, so a turn is call -> result -> answer, in one turn."""

from __future__ import annotations

import pytest

from macapp.core.conversation import ConversationModel
from macapp.core.engine import Engine, SessionOptions
from macapp.core.engine.turns import full_prompt
from macapp.core.events import AnswerDelta, Finished, ToolCallAsked, ToolCallDone, TurnKind
from macapp.core.recorder import ChatRecorder, TurnResult
from macapp.core.sampling import greedy
from macapp.core.tools.approvals import Decision
from macapp.core.tools.host import McpHost
from macapp.core.tools.loop import DENIED, ToolLoop, ToolPolicy
from macapp.core.tools.results import FIT_WHY
from tests.fixtures.mcp_servers import McpFiles
from tests.fixtures.scripted import AFTER_TOOL_TEXT, TOOL_CALL_ARGUMENTS, TOOL_PREAMBLE

TIMEOUT = 120
RESULT = "Sunny in Paris for 3 days (without the secret)."


@pytest.fixture(scope="module")
def engine(scripted_answering_tool_path):
    e = Engine()
    e.load(str(scripted_answering_tool_path)).result(timeout=TIMEOUT)
    yield e
    e.close()


def run(engine, store, loop: ToolLoop, thinking: bool = False):
    recorder = ChatRecorder(store, model="tiny", interval=0.0)
    conv = ConversationModel(lambda system, messages: engine.new_session(system, messages), recorder, run_turn=loop.run)
    turn = conv.start(TurnKind.SEND, "What's the weather in Paris?", thinking=thinking, sampling=greedy(200))
    return turn, list(turn.events(timeout=TIMEOUT))


@pytest.mark.parametrize("thinking", [False, True])
def test_the_model_reads_the_result_and_answers_in_the_same_turn(engine, host, files, store, thinking):
    before = len(files.calls())
    turn, events = run(engine, store, ToolLoop(host, ToolPolicy(allowed=[("weather", "get_weather")])), thinking)
    assert [(e.server, e.name, e.arguments) for e in events if isinstance(e, ToolCallAsked)] == [("weather", "get_weather", TOOL_CALL_ARGUMENTS)]
    done = [e.record for e in events if isinstance(e, ToolCallDone)]
    assert [(d.allowed, d.result) for d in done] == [(True, RESULT)]
    assert files.calls()[before:] == ["get_weather Paris 3"]  # the tool really ran, once
    final = events[-1]
    assert isinstance(final, Finished) and final.reply.finish_reason == "stop"
    text = "".join(e.text for e in events if isinstance(e, AnswerDelta))
    assert text == f"{TOOL_PREAMBLE}\n\n{AFTER_TOOL_TEXT}" == final.reply.text  # the answer came after the result
    assert text.index(AFTER_TOOL_TEXT) > text.index(TOOL_PREAMBLE)
    prompt = engine.model.tokenizer.decode(turn.session.tokens)
    assert prompt.index(f"<tool_response>\n{RESULT}\n</tool_response>") < prompt.rindex(AFTER_TOOL_TEXT)
    assert turn.outcome.result is TurnResult.COMPLETE
    user, reply = store.get_conversation(turn.conversation.conversation_id).messages
    assert user.content == "What's the weather in Paris?" and reply.content == text and reply.finish_reason == "stop"
    assert [(c["name"], c["arguments"], c["allowed"], c["result"]) for c in reply.tool_calls] == [("get_weather", TOOL_CALL_ARGUMENTS, True, RESULT)]
    if thinking:
        assert final.reply.thinking and final.reply.reasoning.count("Let me think") == 2  # both rounds thought


def test_a_denied_call_is_answered_after_the_model_is_told(engine, host, files, store):
    before = len(files.calls())
    asked = []
    turn, events = run(engine, store, ToolLoop(host, ToolPolicy(ask=lambda r: asked.append(r) or Decision.DENY)))
    assert len(asked) == 1 and asked[0].arguments == TOOL_CALL_ARGUMENTS
    assert [(e.record.allowed, e.record.result) for e in events if isinstance(e, ToolCallDone)] == [(False, None)]
    assert files.calls()[before:] == []  # it did not run
    assert f"<tool_response>\n{DENIED}\n</tool_response>" in engine.model.tokenizer.decode(turn.session.tokens)
    final = events[-1]
    assert isinstance(final, Finished) and final.reply.finish_reason == "stop" and final.reply.text.endswith(AFTER_TOOL_TEXT)
    reply = store.get_conversation(turn.conversation.conversation_id).messages[1]
    assert reply.content == final.reply.text and [(c["allowed"], c["result"]) for c in reply.tool_calls] == [(False, None)]


@pytest.mark.parametrize("thinking", [False, True])
def test_a_reopened_tool_turn_feeds_the_model_the_same_prompt(engine, host, store, thinking):
    turn, events = run(engine, store, ToolLoop(host, ToolPolicy(allowed=[("weather", "*")])), thinking)
    assert isinstance(events[-1], Finished)
    live = turn.session
    saved = store.get_conversation(turn.conversation.conversation_id)
    reopened = saved.chat_messages(include_system=False)
    held = [m for m in live.messages if m["role"] != "system"]
    assert saved.messages[1].cache_tokens == ()  # a turn of several rounds: read again as its rounds' text
    # the rounds as the session held them: the call as the model wrote it, its result, then the answer
    assert [(m["role"], m["content"]) for m in reopened] == [(m["role"], m["content"]) for m in held]
    assert [m["role"] for m in reopened] == ["user", "assistant", "user", "assistant"] and "<tool_call>" in reopened[1]["content"]
    assert reopened[2]["content"] == f"<tool_response>\n{RESULT}\n</tool_response>" and reopened[3]["content"] == AFTER_TOOL_TEXT
    tokenizer = engine.model.tokenizer
    before = full_prompt(tokenizer, live.system_prompt, held, "And tomorrow?", thinking)[1]
    after = full_prompt(tokenizer, live.system_prompt, reopened, "And tomorrow?", thinking)[1]
    assert after == before and f"<tool_response>\n{RESULT}\n</tool_response>" in tokenizer.decode(after)
    # a conversation reopened from the history reads them too, and its next turn answers from there
    recorder = ChatRecorder.resume(store, saved.id)
    loop = ToolLoop(host, ToolPolicy(allowed=[("weather", "*")]))
    conv = ConversationModel(lambda system, messages: engine.new_session(system, messages), recorder, saved=saved, run_turn=loop.run)
    again = conv.start(TurnKind.SEND, "And tomorrow?", thinking=thinking, sampling=greedy(200))
    final = again.wait(TIMEOUT)
    assert isinstance(final, Finished) and final.reply.text == AFTER_TOOL_TEXT  # the result is in its prompt: no new call
    prompt = tokenizer.decode(again.session.tokens)
    assert prompt.count(f"<tool_response>\n{RESULT}\n</tool_response>") == 1 and prompt.count("<tool_call>\n<function=get_weather>") == 1
    answered = store.get_conversation(saved.id).messages[-1]  # a turn of one round keeps its tokens, as without tools
    assert answered.cache_tokens and list(answered.cache_tokens) == again.session.messages[-1]["cache_tokens"]
    # a regenerate answers the user's own message again (the rounds folded), calling the tool anew
    redo = conv.start(TurnKind.REGENERATE, thinking=thinking, sampling=greedy(200))
    assert isinstance(redo.wait(TIMEOUT), Finished)
    messages = store.get_conversation(saved.id).messages
    assert [m.content for m in messages if m.role.value == "user"] == ["What's the weather in Paris?", "And tomorrow?"]


def test_a_huge_result_is_cut_to_what_is_left_of_the_context_and_the_turn_ends_with_the_answer(engine, tmp_path, store):
    files = McpFiles(tmp_path / "calls.txt", tmp_path / "pids.txt")
    limit = 3000
    with McpHost([files.stdio(mode="huge")]) as host:  # 3 MB of "x": millions of tokens of the tiny tokenizer
        loop = ToolLoop(host, ToolPolicy(allowed=[("weather", "*")]))
        recorder = ChatRecorder(store, model="tiny", interval=0.0)
        small = SessionOptions(context_limit=limit)
        conv = ConversationModel(lambda system, messages: engine.new_session(system, messages, options=small), recorder, run_turn=loop.run)
        turn = conv.start(TurnKind.SEND, "What's the weather in Paris?", thinking=False, sampling=greedy(200))
        events = list(turn.events(timeout=TIMEOUT))
    assert files.still_running() == [] and files.calls() == ["get_weather Paris 3"]
    final = events[-1]
    assert isinstance(final, Finished) and final.reply.finish_reason == "stop" and final.reply.text.endswith(AFTER_TOOL_TEXT)
    (record,) = [e.record for e in events if isinstance(e, ToolCallDone)]
    head, note = record.result.split("\n[result cut", 1)
    assert head == "x" * len(head) and len(head) > 1000 and note == f": 3145728 bytes, the first {len(head)} shown; {FIT_WHY}]"
    assert len(turn.session.tokens) <= limit  # the result, the call and the answer all fit
