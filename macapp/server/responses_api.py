"""OpenAI Responses (`POST /v1/responses`): a request body -> CompletionRequest, as Codex and `client.responses.create`
send it. The body's model is requests/responses_body.py (its input items requests/responses_input.py); the reply
side is responses_output.py; the route responses_route.py.
"""

from __future__ import annotations

import uuid
from macapp.core.jsonvalue import JSONObject
from macapp.core.serving.requests import ChatMessage
from macapp.server.requests.reading import read
from macapp.server.requests.responses_body import ResponsesBody, ResponsesCall

API = "responses"  # the name unused fields are logged under


def read_body(body: JSONObject) -> ResponsesBody:
    """A Responses body (a JSON object) as its model, or a 400 naming the field at fault."""
    return read(ResponsesBody, body, API)


def parse_responses_request(body: JSONObject, default_thinking: bool, client: str = "", previous: tuple[ChatMessage, ...] = ()) -> ResponsesCall:
    """The request; `previous` is the conversation of the response named by previous_response_id (the route looks
    it up), which this input continues."""
    return read_body(body).to_call(default_thinking, client, previous)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"
