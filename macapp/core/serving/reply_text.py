"""Between a reply stream and the request's job: the answer text through the tool-call parser and the stop
sequences, so AnswerDelta never carries tool-call markup nor anything from a stop sequence on; a request for at
most one call (`ToolChoice.parallel` off) ends after the first. Shared by the batched and the one-at-a-time paths."""

from __future__ import annotations

from macapp.core.engine import Job, LoadedModel, StreamedReply
from macapp.core.events import AnswerDelta, Event, ReasoningDelta
from macapp.core.serving.render import RenderedPrompt
from macapp.core.serving.requests import Completed, CompletionRequest, FinishReason, ToolCall, ToolCallFinished, ToolCallStarted, Usage
from macapp.core.serving.stops import StopMatcher
from macapp.core.serving.toolcalls import Piece, ToolCallParser


def cancelled(m: LoadedModel, usage: Usage) -> Completed:
    return Completed(text="", reasoning="", tool_calls=(), finish_reason=FinishReason.CANCELLED, usage=usage, model=m.info.name)


def completed(m: LoadedModel, text: "ReplyText", streamed: StreamedReply, usage: Usage) -> Completed:
    """The request's Completed once its reply stream ended (the held-back text released)."""
    reply = streamed.reply
    usage.completion_tokens = len(reply.token_ids)
    usage.reasoning_tokens = reply.stats.reasoning_tokens
    reason = text.finish(reply.finish_reason)
    return Completed(
        text=text.text,
        reasoning=reply.reasoning,
        tool_calls=tuple(text.calls),
        finish_reason=reason,
        usage=usage,
        stop_sequence=text.stops.matched,
        model=m.info.name,
        ttft_s=reply.stats.ttft_s,
        generation_tps=reply.stats.generation_tps,
        mtp_acceptance=reply.stats.mtp_acceptance if reply.stats.mtp_steps else None,
        mtp_tokens_per_step=reply.stats.mtp_tokens_per_step if reply.stats.mtp_steps else None,
    )


class ReplyText:
    """Between the reply's bookkeeping (engine/reply.py) and the job: answer text through the tool-call parser and the stop sequences."""

    def __init__(self, job: Job, rendered: RenderedPrompt, request: CompletionRequest):
        self.job = job
        self.parser = ToolCallParser(rendered.tools) if rendered.tools else None
        if self.parser is not None and rendered.prefill:
            self.parser.feed(rendered.prefill)  # the forced call's opening: the reply goes on inside it
        self.stops = StopMatcher(request.stop)
        self.single_call = not request.tool_choice.parallel
        self.pieces: list[str] = []
        self.calls: list[ToolCall] = []

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def should_stop(self) -> bool:
        return self.stops.matched is not None or self.job.stopped or (self.single_call and bool(self.calls))

    def emit(self, event: Event) -> None:
        if isinstance(event, AnswerDelta):
            self._pieces(self.parser.feed(event.text) if self.parser is not None else [event.text])
        elif isinstance(event, ReasoningDelta) and self.stops.matched is not None:
            return
        else:
            self.job.emit(event)

    def finish(self, engine_finish: str) -> FinishReason:
        """Release what was held back; the request's finish reason from the engine's."""
        if self.parser is not None:
            self._pieces(self.parser.flush(complete=engine_finish == "stop"))
        self._say(self.stops.flush())
        if self.stops.matched is not None:
            return FinishReason.STOP_SEQUENCE
        if engine_finish == "stopped" and not (self.single_call and self.calls):
            return FinishReason.CANCELLED
        if engine_finish in ("length", "context"):
            return FinishReason.LENGTH
        return FinishReason.TOOL_CALLS if self.calls else FinishReason.STOP

    def _pieces(self, pieces: list[Piece]) -> None:
        for piece in pieces:
            if self.stops.matched is not None:
                return
            if isinstance(piece, ToolCall):
                if self.single_call and self.calls:
                    return  # one call was asked for: the others in its block, and anything after, are not the reply
                self._say(self.stops.flush())  # held text was no stop sequence: the text ended at the call
                index = len(self.calls)
                self.calls.append(piece)
                self.job.emit(ToolCallStarted(index, piece.id, piece.name))
                self.job.emit(ToolCallFinished(index, piece))
            else:
                self._say(self.stops.feed(piece))

    def _say(self, text: str) -> None:
        if text:
            self.pieces.append(text)
            self.job.emit(AnswerDelta(text))
