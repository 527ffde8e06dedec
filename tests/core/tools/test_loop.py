"""The tool loop on the real engine: a tiny scripted Qwen3.5 that calls `get_weather(city="Paris", days=3)` in every
reply (tests/fixtures/scripted.py), real MCP servers written with the SDK, a real history. The model calls in
every round, so each turn here ends at its round bound (finish_reason "tool_rounds"), which the tests set low."""

from __future__ import annotations

import pytest

from macapp.core.conversation import ConversationModel
from macapp.core.engine import Engine, SessionOptions
from macapp.core.events import AnswerDelta, Failed, Finished, PromptProgress, ReasoningDelta, ToolCallAsked, ToolCallDone, TurnKind
from macapp.core.recorder import ChatRecorder, TurnResult
from macapp.core.sampling import greedy
from macapp.core.tools.approvals import Approvals, Decision, approvals_path
from macapp.core.tools.host import McpHost
from macapp.core.tools.loop import DENIED, ROUNDS_REASON, ApprovalRequest, ToolLoop, ToolPolicy
from macapp.core.tools.results import FIT_WHY, RESULT_LIMIT
from tests.fixtures.mcp_servers import McpFiles
from tests.fixtures.mcp_server import SPECIAL_RESULT
from tests.fixtures.scripted import TOOL_CALL_ARGUMENTS, TOOL_PREAMBLE

TIMEOUT = 120
RESULT = "Sunny in Paris for 3 days (without the secret)."
HUGE_CONTEXT = 4000  # tokens: the huge result is cut to what is left of them


@pytest.fixture(scope="module")
def engine(scripted_tool_model_path):
    e = Engine()
    e.load(str(scripted_tool_model_path)).result(timeout=TIMEOUT)
    yield e
    e.close()


def conversation(engine, store, loop: ToolLoop, options: SessionOptions | None = None) -> ConversationModel:
    recorder = ChatRecorder(store, model="tiny", interval=0.0)
    return ConversationModel(lambda system, messages: engine.new_session(system, messages, options=options), recorder, run_turn=loop.run)


def run(conv: ConversationModel, thinking: bool = False, **options):
    turn = conv.start(TurnKind.SEND, "What's the weather in Paris?", thinking=thinking, sampling=greedy(200), **options)
    events = list(turn.events(timeout=TIMEOUT))
    return turn, events


def test_an_allowed_call_runs_and_its_result_is_read_with_prompt_reuse(engine, host, files, store):
    before = len(files.calls())
    loop = ToolLoop(host, ToolPolicy(allowed=[("weather", "*")]), max_rounds=2)
    conv = conversation(engine, store, loop)
    turn, events = run(conv)
    done = [e.record for e in events if isinstance(e, ToolCallDone)]
    asked = [e for e in events if isinstance(e, ToolCallAsked)]
    assert [(a.server, a.name, a.arguments) for a in asked] == [("weather", "get_weather", TOOL_CALL_ARGUMENTS)] * 2
    assert [(d.allowed, d.result, d.is_error) for d in done] == [(True, RESULT, False)] * 2
    assert files.calls()[before:] == ["get_weather Paris 3"] * 2  # the tool really ran, once a round
    final = events[-1]
    assert isinstance(final, Finished) and final.reply.finish_reason == ROUNDS_REASON
    text = "".join(e.text for e in events if isinstance(e, AnswerDelta))
    assert "<tool_call>" not in text and text.startswith(TOOL_PREAMBLE) and "Stopped after 2 rounds of tool calls" in text
    assert final.reply.text == text
    # the second round read only the tool result: its prompt is a small part of the first's (tools and all)
    totals = [e.total for e in events if isinstance(e, PromptProgress) and e.processed == 0]
    assert len(totals) == 2 and totals[1] * 3 < totals[0]
    prompt = engine.model.tokenizer.decode(turn.session.tokens)
    assert prompt.count(f"<tool_response>\n{RESULT}\n</tool_response>") == 1 and "get_weather" in prompt.split("<|im_end|>")[0]
    # the history holds the calls, and the user's own system prompt (no tool block)
    assert turn.outcome.result is TurnResult.COMPLETE
    saved = store.get_conversation(conv.conversation_id)
    user, reply = saved.messages
    assert saved.system_prompt is None and reply.content == text and reply.finish_reason == ROUNDS_REASON
    assert [(c["server"], c["name"], c["arguments"], c["allowed"], c["result"]) for c in reply.tool_calls] == [
        ("weather", "get_weather", TOOL_CALL_ARGUMENTS, True, RESULT)
    ] * 2
    exported = store.export_dict(conv.conversation_id)
    assert exported["messages"][1]["tool_calls"] == reply.tool_calls
    imported = store.get_conversation(store.import_json(store.export_json(conv.conversation_id)))
    assert imported.messages[1].tool_calls == reply.tool_calls  # the JSON export brings them back
    assert "<summary>Tool call: weather/get_weather</summary>" in store.export_markdown(conv.conversation_id)


def test_a_denied_call_does_not_run_and_the_model_is_told(engine, host, files, store):
    before = len(files.calls())
    loop = ToolLoop(host, ToolPolicy(), max_rounds=2)  # nobody to ask, nothing allowed: denied
    turn, events = run(conversation(engine, store, loop))
    done = [e.record for e in events if isinstance(e, ToolCallDone)]
    assert [(d.allowed, d.result) for d in done] == [(False, None)] * 2
    assert files.calls()[before:] == []
    assert DENIED in engine.model.tokenizer.decode(turn.session.tokens)
    reply = store.get_conversation(turn.conversation.conversation_id).messages[1]
    assert [c["allowed"] for c in reply.tool_calls] == [False, False] and all(c["result"] is None for c in reply.tool_calls)


def test_always_allow_is_remembered_and_revocable(engine, host, files, store):
    asked: list[ApprovalRequest] = []

    def ask(request: ApprovalRequest) -> Decision:
        asked.append(request)
        return Decision.ALWAYS

    approvals = Approvals(approvals_path())
    loop = ToolLoop(host, ToolPolicy(approvals, ask=ask), max_rounds=2)
    before = len(files.calls())
    run(conversation(engine, store, loop))
    assert len(asked) == 1 and asked[0].arguments == TOOL_CALL_ARGUMENTS and '"city": "Paris"' in asked[0].arguments_json
    assert files.calls()[before:] == ["get_weather Paris 3"] * 2  # the second round ran without asking
    assert Approvals(approvals_path()).remembered() == [("weather", "get_weather")]  # kept on disk
    approvals.revoke("weather", "get_weather")
    assert Approvals(approvals_path()).remembered() == []
    loop = ToolLoop(host, ToolPolicy(approvals, ask=lambda r: asked.append(r) or Decision.ALLOW_ONCE), max_rounds=1)
    run(conversation(engine, store, loop))
    assert len(asked) == 2  # asked again once revoked


def test_thinking_keeps_working_across_rounds(engine, host, store):
    loop = ToolLoop(host, ToolPolicy(allowed=[("weather", "get_weather")]), max_rounds=2)
    turn, events = run(conversation(engine, store, loop), thinking=True, thinking_budget=3)
    reasoning = [e for e in events if isinstance(e, ReasoningDelta)]
    assert reasoning and events[-1].reply.thinking and events[-1].reply.budget_hit
    assert len([e for e in events if isinstance(e, ToolCallDone)]) == 2


@pytest.mark.parametrize("mode", ["slow", "huge", "special"])
def test_hanging_huge_and_special_token_results(engine, tmp_path, store, mode):
    files = McpFiles(tmp_path / "calls.txt", tmp_path / "pids.txt")
    with McpHost([files.stdio(mode=mode)], timeout_s=1.0 if mode == "slow" else 60.0) as host:
        loop = ToolLoop(host, ToolPolicy(allowed=[("weather", "*")]), max_rounds=2)
        # 3 MB of "x" is millions of tokens of the tiny tokenizer: cut to 256 KiB, then to what the context has left
        turn, events = run(conversation(engine, store, loop, SessionOptions(context_limit=HUGE_CONTEXT) if mode == "huge" else None))
    assert files.still_running() == []
    assert isinstance(events[-1], Finished) and events[-1].reply.finish_reason == ROUNDS_REASON  # the turn ended
    record = [e.record for e in events if isinstance(e, ToolCallDone)][0]
    assert files.calls()[0] == "get_weather Paris 3"
    tokenizer = engine.model.tokenizer
    if mode == "slow":
        assert record.timed_out and record.result == "The tool did not answer within 1 s."
    if mode == "huge":
        head, note = record.result.split("\n[result cut", 1)
        assert len(record.result.encode()) <= RESULT_LIMIT and note == f": 3145728 bytes, the first {len(head)} shown; {FIT_WHY}]"
        assert head == "x" * len(head) and 500 < len(head) < HUGE_CONTEXT and len(turn.session.tokens) <= HUGE_CONTEXT
        later = [e.record for e in events if isinstance(e, ToolCallDone)][1]  # the second round's: what the first left
        assert FIT_WHY in later.result and len(later.result) < len(record.result)
    if mode == "special":
        assert record.result != SPECIAL_RESULT and record.result.replace("\u200b", "") == SPECIAL_RESULT
        # the result stayed text: the prompt holds just its five turns (system, user, reply, results, reply)
        im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
        assert turn.session.tokens.count(im_start) == 5
        assert "HACKED" in tokenizer.decode(turn.session.tokens)


def test_regenerate_after_a_tool_turn_answers_the_users_message_again(engine, host, store):
    loop = ToolLoop(host, ToolPolicy(allowed=[("weather", "*")]), max_rounds=1)
    conv = conversation(engine, store, loop)
    run(conv)
    turn = conv.start(TurnKind.REGENERATE, thinking=False, sampling=greedy(200))
    assert isinstance(turn.wait(TIMEOUT), Finished)
    messages = store.get_conversation(conv.conversation_id).messages
    assert [m.role for m in messages] == ["user", "assistant"] and messages[0].content == "What's the weather in Paris?"
    assert len(messages[1].tool_calls) == 1


def test_two_hundred_tools_grow_the_prompt_and_the_context_check_counts_them(engine, host, tmp_path, store):
    tokenizer = engine.model.tokenizer
    turn, events = run(conversation(engine, store, ToolLoop(host, ToolPolicy(), max_rounds=1)))
    few_prompt = [e.total for e in events if isinstance(e, PromptProgress)][0]
    few_tools = len(tokenizer.encode(turn.session.system_prompt))
    files = McpFiles(tmp_path / "calls.txt", tmp_path / "pids.txt")
    with McpHost([files.stdio(mode="many")]) as many_host:
        loop = ToolLoop(many_host, ToolPolicy(), max_rounds=1)
        session = engine.new_session()
        loop.offer(session)
        assert len(many_host.tools()) == 202 and "lookup_199" in session.system_prompt
        assert len(tokenizer.encode(session.system_prompt)) > few_tools + 200 * 10  # each tool's name, description, schema
        # a context that holds the question with two tools but not with two hundred: the check counts them
        small = SessionOptions(context_limit=few_prompt + 200)
        recorder = ChatRecorder(store, model="tiny", interval=0.0)
        tight = ConversationModel(lambda system, messages: engine.new_session(system, messages, options=small), recorder, run_turn=loop.run)
        turn, events = run(tight)
        assert isinstance(events[-1], Failed) and events[-1].code == "context_limit"
        assert not [e for e in events if isinstance(e, PromptProgress)]  # refused before reading anything


def test_a_turn_stopped_while_asking_runs_nothing(engine, host, files, store):
    before = len(files.calls())
    turns = []

    def ask(request: ApprovalRequest) -> Decision:
        turns[0].stop()  # the user stops the reply while the question is open
        assert request.cancelled.is_set()
        return Decision.ALLOW_ONCE

    conv = conversation(engine, store, ToolLoop(host, ToolPolicy(ask=ask), max_rounds=3))
    turn = conv.start(TurnKind.SEND, "Weather?", thinking=False, sampling=greedy(200))
    turns.append(turn)
    final = turn.wait(TIMEOUT)
    assert isinstance(final, Finished) and final.reply.finish_reason == "stopped"
    assert files.calls()[before:] == []
    done = [e.record for e in turn.history if isinstance(e, ToolCallDone)]
    assert [(d.allowed, d.result) for d in done] == [(False, None)]
    assert turn.outcome.result is TurnResult.STOPPED
