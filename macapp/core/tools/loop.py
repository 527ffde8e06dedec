"""The tool loop: one chat turn in which the model may call the MCP servers' tools, round after round.

    loop = ToolLoop(host, ToolPolicy(approvals, ask=ask_the_user), max_rounds=16)
    job = loop.run(session, TurnKind.SEND, "What's the weather in Paris?", thinking=True)   # a Job, as session.send's

A round is one of the session's own jobs (send / regenerate / edit for the first, then `send` of the tool results):
its answer text goes through the API server's Qwen3.5 tool-call parser (serving.toolcalls), so the calls come out
whole and their markup never reaches the answer. After a round that called tools, each call is approved (the
policy: `--allow-tool` patterns, remembered "always", else the user is asked; nobody to ask: denied), run with the
host's timeout, and its result (cut, special tokens defused: results.py) goes into the next round's message; a
denied call's result tells the model it was denied. The session appends that message to its cache, so a round
reads only the new results. The turn ends when the model answers without calling, when it is stopped, or after
`max_rounds` rounds (a note says so, finish_reason "tool_rounds").

The returned Job carries the rounds' text and reasoning, a ToolCallAsked and a ToolCallDone per call, and one
Finished whose Reply holds the answer text of every round (no markup) and the turn's added-up figures.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from macapp.core.engine.errors import EngineError
from macapp.core.engine.jobs import Job
from macapp.core.events import (
    AnswerDelta,
    Failed,
    Finished,
    ReasoningDelta,
    Reply,
    TerminalEvent,
    ToolCallAsked,
    ToolCallDone,
    ToolCallRecord,
    TurnKind,
)
from macapp.core.recorder import run_on
from macapp.core.serving.requests import ToolCall
from macapp.core.serving.toolcalls import ToolCallParser
from macapp.core.tools.approvals import Approvals, Decision, pattern_allows
from macapp.core.tools.host import HostTool, McpHost
from macapp.core.tools.prompt import tools_system_prompt
from macapp.core.tools.rounds import DENIED, ROUND_JOIN, ROUNDS_REASON, tool_responses
from macapp.core.tools.results import fit, for_prompt

if TYPE_CHECKING:
    from macapp.core.engine.session import ChatSession
    from macapp.core.sampling import SamplingParams
    from macapp.core.vision.images import PreparedImage

log = logging.getLogger(__name__)

MAX_ROUNDS = 16
ANSWER_ROOM = 1024  # tokens of context a result leaves for the answer (at most a quarter of the context)
ROUND_OVERHEAD = 16  # the template's tokens around a round's results (closing the reply, the user turn, the reply's start)


@dataclass(frozen=True)
class ApprovalRequest:
    """What the user is asked about: the server, its tool and the full arguments."""

    server: str
    tool: str
    arguments: dict[str, object]
    description: str = ""
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False)  # set when the turn is stopped

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, indent=2, ensure_ascii=False, sort_keys=True)


Approver = Callable[[ApprovalRequest], Decision]  # blocks until the user answers (on the loop's thread)


class ToolPolicy:
    """Who decides about a call: the `allowed` (server, tool) patterns (tool "*": all of one server's) and the
    remembered "always" run without asking; the rest go to `ask`, or, without one, are denied."""

    def __init__(self, approvals: Approvals | None = None, ask: Approver | None = None, allowed: list[tuple[str, str]] | None = None) -> None:
        self.approvals = approvals or Approvals()
        self.ask = ask
        self.allowed = list(allowed or [])

    def decide(self, request: ApprovalRequest) -> Decision:
        if pattern_allows(self.allowed, request.server, request.tool) or self.approvals.always(request.server, request.tool):
            return Decision.ALLOW_ONCE
        if self.ask is None:
            return Decision.DENY
        decision = self.ask(request)
        if decision is Decision.ALWAYS:
            self.approvals.remember(request.server, request.tool)
        return decision


class ToolTurnJob(Job):
    """The turn's Job: its stop also stops the round in flight and any approval waiting for an answer."""

    def __init__(self) -> None:
        super().__init__("chat")
        self.round: Job | None = None
        self.asking: ApprovalRequest | None = None

    def stop(self) -> None:
        super().stop()
        if self.asking is not None:
            self.asking.cancelled.set()
        if self.round is not None:
            self.round.stop()


@dataclass
class _Turn:
    """What the rounds add up to."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    reasoning_tokens: int = 0
    rounds: int = 0


class ToolLoop:
    def __init__(
        self, host: McpHost, policy: ToolPolicy, max_rounds: int = MAX_ROUNDS, timeout_s: float | None = None, warn: Callable[[str], None] | None = None
    ) -> None:
        self.host = host
        self.warn = warn  # told each server that failed to start (the host logs them too)
        self.policy = policy
        self.max_rounds = max_rounds
        self.timeout_s = timeout_s
        self._own_system: weakref.WeakKeyDictionary[ChatSession, str | None] = weakref.WeakKeyDictionary()  # before the tools

    def offer(self, session: ChatSession) -> None:
        """Start the servers (first time only) and make `session` offer their tools (its system prompt; a cache
        read without them is dropped, so the next turn reads the conversation with them)."""
        if not self.host.started:
            for warning in self.host.start():
                if self.warn is not None:
                    self.warn(warning)
        model = session.engine.model
        if model is None:
            return
        own = self._own_system.get(session, session.system_prompt)
        wanted = tools_system_prompt(model.tokenizer, own, [t.spec() for t in self.host.tools()])
        if wanted != session.system_prompt:
            if session.tokens:
                session.reset()  # a job before the turn's: the turn reads the conversation again, tools and all
            self._own_system[session] = own
            session.system_prompt = wanted

    def run(
        self,
        session: ChatSession,
        kind: TurnKind,
        text: str = "",
        *,
        thinking: bool,
        sampling: SamplingParams | None = None,
        thinking_budget: int | None = None,
        images: tuple[PreparedImage, ...] = (),
    ) -> Job:
        """The turn as one Job (see the module docstring), with recorder.run_on's arguments (`images` for a send)."""
        job = ToolTurnJob()
        pictures = {"images": images} if images else {}
        first = lambda: run_on(session, kind, text, thinking=thinking, sampling=sampling, thinking_budget=thinking_budget, **pictures)  # noqa: E731
        threading.Thread(target=self._drive, args=(job, session, first, thinking, sampling, thinking_budget), name="qwen-desk-tools", daemon=True).start()
        return job

    # -- the loop's thread
    def _drive(
        self, job: ToolTurnJob, session: ChatSession, first: Callable[[], Job], thinking: bool, sampling: SamplingParams | None, budget: int | None
    ) -> None:
        turn = _Turn()
        try:
            self.offer(session)  # here, not on the caller's thread (the window's): the servers may take seconds to start
            job.round = first()
            if job.stopped:
                job.round.stop()
            while True:
                assert job.round is not None
                last, calls = self._follow(job, job.round, turn)
                job.round.join()
                if isinstance(last, Failed):
                    job.emit(last)  # what the rounds wrote is kept by the recorder, as a failed reply's
                    return
                assert isinstance(last, Finished)
                reply = last.reply
                if turn.rounds == 1 and not reply.kept:
                    job.emit(last)  # stopped before anything: the turn is undone, as without tools
                    return
                if not calls or reply.finish_reason != "stop" or job.stopped:
                    job.emit(Finished(self._reply(reply, turn)))
                    return
                results: list[str] = []
                for call in calls:
                    results.append(self._call(job, call, turn, reply.text, self._room(session, results)))
                if job.stopped:
                    job.emit(Finished(self._reply(dataclasses.replace(reply, finish_reason="stopped"), turn)))
                    return
                if turn.rounds >= self.max_rounds:
                    rounds = "1 round" if self.max_rounds == 1 else f"{self.max_rounds} rounds"
                    note = f"[Stopped after {rounds} of tool calls: the model kept calling tools. Ask again to go on.]"
                    self._say(job, turn, note)
                    job.emit(Finished(self._reply(dataclasses.replace(reply, finish_reason=ROUNDS_REASON), turn)))
                    return
                job.round = session.send(tool_responses(results), thinking=thinking, sampling=sampling, thinking_budget=budget)
                if job.stopped:
                    job.round.stop()
        except EngineError as exc:  # refused by the session (no model, an empty message…): as without tools
            job.emit(Failed(exc.message, exc.code))
        except Exception as exc:  # noqa: BLE001 - the turn must end with a terminal event whatever happened
            log.exception("the tool loop failed")
            job.emit(Failed(f"The tool loop failed: {exc}"))
        finally:
            job.settle()

    def _follow(self, job: ToolTurnJob, round_job: Job, turn: _Turn) -> tuple[TerminalEvent, list[ToolCall]]:
        """Pass one round's events on (answer text through the parser); its terminal event and the calls it made."""
        turn.rounds += 1
        tools = [t.spec() for t in self.host.tools()]
        parser = ToolCallParser(tools) if tools else None  # no tools offered: a call the model writes is its text
        first = True
        for event in round_job.events():
            if isinstance(event, ReasoningDelta):
                turn.reasoning.append(event.text)
                job.emit(event)
            elif isinstance(event, AnswerDelta):
                for piece in parser.feed(event.text) if parser is not None else [event.text]:
                    if isinstance(piece, str):
                        first = self._piece(job, turn, piece, first)
            elif isinstance(event, TerminalEvent):
                if isinstance(event, Finished):
                    for piece in parser.flush(complete=event.reply.finish_reason == "stop") if parser is not None else []:
                        if isinstance(piece, str):
                            first = self._piece(job, turn, piece, first)
                    stats = event.reply.stats
                    turn.prompt_tokens += stats.prompt_tokens
                    turn.generation_tokens += stats.generation_tokens
                    turn.reasoning_tokens += stats.reasoning_tokens
                return event, list(parser.calls) if parser is not None else []
            else:  # PromptProgress, StatsUpdate
                job.emit(event)
        raise RuntimeError("a round ended without its terminal event")

    def _piece(self, job: ToolTurnJob, turn: _Turn, piece: str, first: bool) -> bool:
        if first and turn.text:
            piece = ROUND_JOIN + piece
        turn.text.append(piece)
        job.emit(AnswerDelta(piece))
        return False

    def _say(self, job: ToolTurnJob, turn: _Turn, note: str) -> None:
        self._piece(job, turn, note, True)

    @staticmethod
    def _room(session: ChatSession, earlier: list[str]) -> tuple[Callable[[str], int], int] | None:
        """How to count a result's tokens and how many the context has left for it after the `earlier` results of
        its round, leaving the answer its room (ANSWER_ROOM, at most a quarter of the context); None without a model."""
        model = session.engine.model
        if model is None:
            return None
        tokenizer = model.tokenizer
        limit = min(session.options.context_limit or model.info.max_context, model.info.max_context)

        def count(text: str) -> int:
            return len(tokenizer.encode(text, add_special_tokens=False))

        spent = len(session.tokens) + count(tool_responses([*earlier, ""])) + ROUND_OVERHEAD
        return count, limit - spent - min(ANSWER_ROOM, limit // 4)

    def _call(self, job: ToolTurnJob, call: ToolCall, turn: _Turn, said: str, room: tuple[Callable[[str], int], int] | None = None) -> str:
        """Approve and run one call of the round that wrote `said`; its ToolCallAsked and ToolCallDone emitted; the
        result text for the prompt (cut to fit the context's `room`: _room). The record keeps the round, where the
        call was in the answer and `said`."""
        arguments = dict(call.arguments)
        at = sum(len(t) for t in turn.text)
        tool: HostTool | None = self.host.find(call.name)
        server = tool.server if tool is not None else ""
        name = tool.name if tool is not None else call.name
        job.emit(ToolCallAsked(call.id, server, name, arguments))
        if tool is None:
            text = f"There is no tool named {call.name!r}."
            job.emit(
                ToolCallDone(
                    ToolCallRecord(server, name, arguments, allowed=False, result=text, is_error=True, call_id=call.id, round=turn.rounds, at=at, said=said)
                )
            )
            return text
        request = ApprovalRequest(tool.server, tool.name, arguments, tool.description)
        job.asking = request
        try:
            decision = Decision.DENY if job.stopped else self.policy.decide(request)
        finally:
            job.asking = None
        if not decision.allowed or job.stopped:
            job.emit(
                ToolCallDone(
                    ToolCallRecord(tool.server, tool.name, arguments, allowed=False, result=None, call_id=call.id, round=turn.rounds, at=at, said=said)
                )
            )
            return DENIED
        outcome = self.host.call(tool, arguments, self.timeout_s)
        text = for_prompt(outcome.text) if room is None else fit(outcome.text, *room)
        if outcome.is_error and not outcome.timed_out and not text.startswith("The "):
            text = f"The tool reported an error: {text}"
        record = ToolCallRecord(
            tool.server, tool.name, arguments, True, text, outcome.is_error, outcome.timed_out, round(outcome.elapsed_s, 3), call.id, turn.rounds, at, said
        )
        job.emit(ToolCallDone(record))
        return text

    @staticmethod
    def _reply(last: Reply, turn: _Turn) -> Reply:
        stats = dataclasses.replace(
            last.stats, prompt_tokens=turn.prompt_tokens, generation_tokens=turn.generation_tokens, reasoning_tokens=turn.reasoning_tokens
        )
        # cache_tokens of a turn of one round only: after a call they are the last round's, and the history keeps the
        # rounds as text (tools.rounds)
        tokens = last.cache_tokens if turn.rounds == 1 else []
        return dataclasses.replace(last, text="".join(turn.text), reasoning="".join(turn.reasoning), stats=stats, kept=True, cache_tokens=tokens)
