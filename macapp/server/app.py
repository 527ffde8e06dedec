"""The ASGI app: routes for both APIs, each answering in its own shape, behind the security guard.

    POST /v1/chat/completions   OpenAI (stream or not)
    POST /v1/messages           Anthropic (stream or not)
    POST /v1/messages/count_tokens
    POST /v1/responses          OpenAI Responses (Codex; stream or not); GET /v1/responses/{id} (responses_route.py)
    GET  /v1/models             the loaded model first, then the downloaded ones (read by both SDKs)
    GET  /v1/models/{name}      one of them (404 for another name, though a request naming it is served)
    GET  /health
    GET  /                      a short hello; Claude Code sends `HEAD /` to warm its connection before each session

Any model name in a request is served by the loaded model; replies name the model that answered.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from macapp.core.download.local import downloaded_repos
from macapp.core.events import Event, Failed
from macapp.core.serving.requests import Completed, CompletionRequest
from macapp.server import anthropic_api, openai_api
from macapp.server.activity import Activity
from macapp.server.completion import Backend, complete, count_tokens, ended_by_shutdown, refusal
from macapp.server.config import ServerConfig
from macapp.server.errors import ApiError, ErrorKind, Flavor, error_body, error_response, flavor_for_path, shutting_down
from macapp.server.fields import parse_json_object
from macapp.server.responses_route import ResponsesEndpoint
from macapp.server.refusals import RefusalDesk
from macapp.server.security import Guard, SecurityPolicy
from macapp.server.sse import JobFeed, SseResponse, paced_frames, sse_comment, sse_frame

log = logging.getLogger(__name__)
CLIENT_GONE = 499  # nginx's code for "the client closed the request": nobody reads it


def client_label(request: Request, api: str) -> str:
    """'127.0.0.1:53211 anthropic (claude-cli/1.0)' for the window's request list."""
    peer = f"{request.client.host}:{request.client.port}" if request.client else "?"
    agent = request.headers.get("user-agent", "").split(" ")[0]
    return f"{peer} {api}" + (f" ({agent})" if agent else "")


def downloaded_model_names() -> list[str]:
    try:
        return sorted(downloaded_repos())
    except OSError:
        return []


def model_entry(name: str, loaded: str, created: int) -> dict[str, object]:
    """One model as both SDKs read it: OpenAI's id/object/created/owned_by, Anthropic's type/display_name/created_at."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "qwen-desk",
        "loaded": name == loaded,
        "type": "model",
        "display_name": name.rsplit("/", 1)[-1],
        "created_at": datetime.fromtimestamp(created, timezone.utc).isoformat().replace("+00:00", "Z"),
    }


@dataclass
class Routes:
    backend: Backend
    config: ServerConfig
    activity: Activity = field(default_factory=Activity)
    started: int = field(default_factory=lambda: int(time.time()))  # the models' `created`: when this server started

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self.backend.model_name})

    async def root(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "server": "qwen-desk", "model": self.backend.model_name})

    async def models(self, request: Request) -> Response:
        loaded = self.backend.model_name
        names = [loaded] + [n for n in await run_in_threadpool(downloaded_model_names) if n != loaded]
        data = [model_entry(n, loaded, self.started) for n in names]
        return JSONResponse({"object": "list", "data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]})

    async def model(self, request: Request) -> Response:
        name, loaded = request.path_params["name"], self.backend.model_name
        if name != loaded and name not in await run_in_threadpool(downloaded_model_names):
            raise ApiError(ErrorKind.NOT_FOUND, f"No model {name!r} here; requests that name it are answered by {loaded!r}.")
        return JSONResponse(model_entry(name, loaded, self.started))

    async def chat_completions(self, request: Request) -> Response | SseResponse:
        body = parse_json_object(await request.body())
        call = openai_api.parse_chat_request(body, self.config.default_thinking, client_label(request, "openai"))
        model = self.backend.model_name
        writer = openai_api.ChunkWriter(model, call.include_usage)
        return await self._complete(
            request,
            call.request,
            call.stream,
            "openai",
            reply=lambda done, _tokens: openai_api.completion_body(done, writer.id, writer.created, model),
            frames=lambda feed, _tokens: self._openai_frames(feed, writer),
        )

    async def messages(self, request: Request) -> Response | SseResponse:
        body = parse_json_object(await request.body())
        call = anthropic_api.parse_messages_request(body, client_label(request, "anthropic"))
        model = self.backend.model_name
        return await self._complete(
            request,
            call.request,
            call.stream,
            "anthropic",
            reply=lambda done, _tokens: anthropic_api.message_body(done, anthropic_api.new_message_id(), model, call.show_thinking),
            frames=lambda feed, tokens: self._anthropic_frames(feed, anthropic_api.EventWriter(model, tokens, call.show_thinking)),
        )

    async def count_tokens(self, request: Request) -> Response:
        body = parse_json_object(await request.body())
        call = anthropic_api.parse_messages_request(body, for_counting=True)
        return JSONResponse({"input_tokens": await run_in_threadpool(count_tokens, self.backend, call.request)})

    async def _complete(
        self,
        request: Request,
        completion: CompletionRequest,
        stream: bool,
        api: str,
        reply: Callable[[Completed, int], dict[str, object]],
        frames: Callable[[JobFeed, int], AsyncIterator[bytes]],
    ) -> Response | SseResponse:
        return await complete(request, self.backend, self.activity, self.config, completion, api, stream=stream, reply=reply, frames=frames)

    async def _openai_frames(self, feed: JobFeed, writer: openai_api.ChunkWriter) -> AsyncIterator[bytes]:
        def translate(event: Event) -> list[bytes]:
            if isinstance(event, Failed):
                return [sse_frame(error_body(refusal(event), Flavor.OPENAI))]
            if ended_by_shutdown(event, self.activity):  # an error object, never a finish_reason
                return [sse_frame(error_body(shutting_down(cut=True), Flavor.OPENAI))]
            return [sse_frame(chunk) for chunk in writer.chunks(event)]

        async for frame in paced_frames(feed, self.config.keepalive_s, translate, sse_comment("keepalive")):
            yield frame
        yield sse_frame("[DONE]")

    async def _anthropic_frames(self, feed: JobFeed, writer: anthropic_api.EventWriter) -> AsyncIterator[bytes]:
        def translate(event: Event) -> list[bytes]:
            if isinstance(event, Failed):
                return [sse_frame(error_body(refusal(event), Flavor.ANTHROPIC), "error")]
            if ended_by_shutdown(event, self.activity):  # an error event, never message_delta / message_stop
                return [sse_frame(error_body(shutting_down(cut=True), Flavor.ANTHROPIC), "error")]
            return [sse_frame(data, name) for name, data in writer.events(event)]

        def keepalive() -> bytes:
            # Anthropic's stream opens with message_start (whose usage waits for the engine's checkpoint lookup):
            # until it is out, keep-alives are SSE comments, which every parser skips; pings after it, as the API sends.
            return sse_frame({"type": "ping"}, "ping") if writer.started else sse_comment("keepalive")

        async for frame in paced_frames(feed, self.config.keepalive_s, translate, keepalive):
            yield frame


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc, flavor_for_path(request.url.path))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kinds = {404: ErrorKind.NOT_FOUND, 405: ErrorKind.METHOD_NOT_ALLOWED}
    kind = kinds.get(exc.status_code, ErrorKind.INVALID_REQUEST)
    message = {
        ErrorKind.NOT_FOUND: f"No endpoint {request.method} {request.url.path} on this server; it serves /v1/chat/completions, /v1/responses, /v1/messages, /v1/messages/count_tokens, /v1/models and /health.",
        ErrorKind.METHOD_NOT_ALLOWED: f"{request.url.path} does not take {request.method}.",
    }.get(kind, str(exc.detail))
    return error_response(ApiError(kind, message), flavor_for_path(request.url.path))


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error answering %s", request.url.path)
    return error_response(ApiError(ErrorKind.SERVER, f"Internal error: {exc}"), flavor_for_path(request.url.path))


def create_app(backend: Backend, config: ServerConfig, activity: Activity | None = None) -> ASGIApp:
    routes = Routes(backend, config, activity or Activity())
    responses = ResponsesEndpoint(backend, config, routes.activity, client_label)
    app = Starlette(
        routes=[
            Route("/", routes.root, methods=["GET"]),  # HEAD too (Starlette adds it to GET)
            Route("/health", routes.health, methods=["GET"]),
            Route("/v1/models", routes.models, methods=["GET"]),
            Route("/v1/models/{name:path}", routes.model, methods=["GET"]),
            Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
            Route("/v1/messages", routes.messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", routes.count_tokens, methods=["POST"]),
            Route("/v1/responses", responses.create, methods=["POST"]),
            Route("/v1/responses/{response_id}", responses.retrieve, methods=["GET"]),
        ],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _unexpected},
    )
    return RefusalDesk(Guard(app, SecurityPolicy.from_config(config)), routes.activity, client_label)
