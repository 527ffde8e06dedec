"""`POST /v1/responses` and `GET /v1/responses/{id}`: the Responses API on the same steps as the other two APIs
(fit the prompt to the context, submit to the engine, answer as JSON or a stream that stops the job when the
client leaves), with the recent responses kept for `previous_response_id`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from macapp.core.events import Event, Failed
from macapp.core.serving.requests import ChatMessage, Completed, FinishReason
from macapp.server.activity import Activity
from macapp.server.completion import Backend, complete, ended_by_shutdown, refusal
from macapp.server.config import ServerConfig
from macapp.server.errors import ApiError, ErrorKind, invalid, shutting_down
from macapp.server.fields import parse_json_object
from macapp.server.requests.responses_body import ResponsesCall
from macapp.server.responses_api import read_body
from macapp.server.responses_output import (
    ResponseShell,
    StreamWriter,
    reply_message,
    response_body,
)
from macapp.server.responses_store import ResponseStore, StoredResponse
from macapp.server.sse import JobFeed, SseResponse, paced_frames, sse_comment, sse_frame

API = "responses"  # the window's request list
CLIENT_GONE = 499


def _in_responses_terms(error: ApiError) -> ApiError:
    """The shared steps name the prompt `messages` (chat completions); here it is `input`."""
    return replace(error, param="input") if error.param == "messages" else error


@dataclass
class ResponsesEndpoint:
    backend: Backend
    config: ServerConfig
    activity: Activity
    label: Callable[[Request, str], str]  # who asked, for the request list (app.client_label)
    store: ResponseStore = field(default_factory=ResponseStore)

    async def retrieve(self, request: Request) -> Response:
        response_id = request.path_params["response_id"]
        stored = self.store.get(response_id)
        if stored is None:
            raise ApiError(
                ErrorKind.NOT_FOUND,
                f"No response {response_id!r} here (responses are kept in memory, the last few hundred, while the server runs).",
                param="response_id",
            )
        return JSONResponse(stored.body)

    def _previous(self, previous_id: str | None) -> tuple[ChatMessage, ...]:
        if previous_id is None:
            return ()
        stored = self.store.get(previous_id)
        if stored is None:
            raise invalid(
                f"Previous response with id {previous_id!r} not found: this server keeps the last few hundred responses "
                "stored (store: true) in memory while it runs; send the whole input instead.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        return stored.conversation

    async def create(self, request: Request) -> Response | SseResponse:
        try:
            return await self._create(request)
        except ApiError as error:
            raise _in_responses_terms(error) from error

    async def _create(self, request: Request) -> Response | SseResponse:
        parsed = read_body(parse_json_object(await request.body()))
        call = parsed.to_call(self.config.default_thinking, self.label(request, API), self._previous(parsed.previous_response_id))
        shell = ResponseShell(self.backend.model_name, call.echo)

        def reply(done: Completed, _prompt_tokens: int) -> dict[str, object]:
            body = response_body(shell, done)
            self._keep(call, done, shell.id, body)
            return body

        def frames(feed: JobFeed, _prompt_tokens: int) -> AsyncIterator[bytes]:
            return self._frames(feed, StreamWriter(shell), call)

        return await complete(request, self.backend, self.activity, self.config, call.request, API, stream=call.stream, reply=reply, frames=frames)

    def _keep(self, call: ResponsesCall, done: Completed, response_id: str, body: dict[str, object]) -> None:
        if call.store and done.finish_reason is not FinishReason.CANCELLED:
            self.store.put(StoredResponse(response_id, (*call.conversation, reply_message(done)), body))

    async def _frames(self, feed: JobFeed, writer: StreamWriter, call: ResponsesCall) -> AsyncIterator[bytes]:
        def frames(events: list[dict[str, object]]) -> list[bytes]:
            return [sse_frame(e, str(e["type"])) for e in events]

        def translate(event: Event) -> list[bytes]:
            if isinstance(event, Failed):
                return frames(writer.failed(_in_responses_terms(refusal(event))))
            if ended_by_shutdown(event, self.activity):  # response.failed, never response.completed
                return frames(writer.failed(shutting_down(cut=True)))
            out = frames(writer.events(event))
            if isinstance(event, Completed) and writer.final is not None:
                self._keep(call, event, writer.shell.id, writer.final)
            return out

        # response.created goes out at once (the real API's first event); keep-alives are comments, which every
        # SSE reader skips, while the engine reads a long prompt.
        for frame in frames(writer.start()):
            yield frame
        async for frame in paced_frames(feed, self.config.keepalive_s, translate, sse_comment("keepalive")):
            yield frame
