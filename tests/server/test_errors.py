"""Each API's own error shape."""

from __future__ import annotations

import json

from macapp.server.errors import ApiError, ErrorKind, Flavor, error_body, error_response, flavor_for_path


def test_flavor_follows_the_path():
    assert flavor_for_path("/v1/messages") is Flavor.ANTHROPIC
    assert flavor_for_path("/v1/messages/count_tokens") is Flavor.ANTHROPIC
    assert flavor_for_path("/v1/chat/completions") is Flavor.OPENAI
    assert flavor_for_path("/nowhere") is Flavor.OPENAI


def test_openai_shape():
    error = ApiError(ErrorKind.INVALID_REQUEST, "bad", param="messages", code="context_length_exceeded")
    assert error_body(error, Flavor.OPENAI) == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}
    }


def test_anthropic_shape():
    assert error_body(ApiError(ErrorKind.TOO_LARGE, "big"), Flavor.ANTHROPIC) == {"type": "error", "error": {"type": "request_too_large", "message": "big"}}
    assert error_body(ApiError(ErrorKind.AUTHENTICATION, "key"), Flavor.ANTHROPIC)["error"]["type"] == "authentication_error"


def test_response_carries_status_and_headers():
    response = error_response(ApiError(ErrorKind.RATE_LIMIT, "busy", headers={"Retry-After": "3"}), Flavor.OPENAI)
    assert response.status_code == 429 and response.headers["retry-after"] == "3"
    assert json.loads(response.body)["error"]["type"] == "rate_limit_error"
