"""The live server's front door: API key (401 in each API's shape), loopback binding, Host and Origin checks."""

from __future__ import annotations

import anthropic
import httpx2
import openai
import pytest

from tests.server.conftest import serve

HELLO = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def keyed(tiny_dense_path):
    with serve(tiny_dense_path, api_key="s3cret", allowed_origins=("http://localhost:5173",)) as served:
        yield served


def test_binds_loopback_by_default(tiny_server):
    sock = tiny_server.server._server.servers[0].sockets[0]
    assert sock.getsockname()[0] == "127.0.0.1"
    assert tiny_server.url.startswith("http://127.0.0.1:")


def test_without_the_key_each_sdk_gets_401_in_its_shape(keyed):
    with pytest.raises(openai.AuthenticationError) as oa:
        keyed.openai(api_key="wrong").chat.completions.create(model="x", messages=HELLO, max_tokens=4)
    assert oa.value.status_code == 401 and oa.value.body["code"] == "invalid_api_key"
    with pytest.raises(anthropic.AuthenticationError) as an:
        keyed.anthropic(api_key="wrong").messages.create(model="x", max_tokens=4, messages=HELLO)
    assert an.value.body["type"] == "error" and an.value.body["error"]["type"] == "authentication_error"


def test_the_key_works_as_bearer_and_as_x_api_key(keyed):
    reply = keyed.openai(api_key="s3cret").chat.completions.create(model="x", messages=HELLO, max_tokens=4, temperature=0)
    assert reply.choices[0].message.content is not None
    message = keyed.anthropic(api_key="s3cret").messages.create(model="x", max_tokens=4, messages=HELLO, extra_body={"temperature": 0})  # x-api-key
    assert message.content
    bearer = anthropic.Anthropic(base_url=keyed.url, auth_token="s3cret", max_retries=0)  # what ANTHROPIC_AUTH_TOKEN sends
    assert bearer.messages.create(model="x", max_tokens=4, messages=HELLO, extra_body={"temperature": 0}).content
    # every request carries the key, /health included
    assert httpx2.get(f"{keyed.url}/health", timeout=10).status_code == 401
    assert httpx2.get(f"{keyed.url}/health", headers={"x-api-key": "s3cret"}, timeout=10).status_code == 200


def test_foreign_host_header_is_refused_dns_rebinding(tiny_server):
    response = httpx2.post(f"{tiny_server.url}/v1/chat/completions", json={"messages": HELLO}, headers={"Host": "attacker.example:8642"}, timeout=10)
    assert response.status_code == 403 and response.json()["error"]["type"] == "permission_error"
    response = httpx2.post(f"{tiny_server.url}/v1/messages", json={"messages": HELLO}, headers={"Host": "attacker.example"}, timeout=10)
    assert response.status_code == 403 and response.json()["type"] == "error"
    assert httpx2.get(f"{tiny_server.url}/health", headers={"Host": "localhost"}, timeout=10).status_code == 200


def test_web_page_origins_are_refused_and_get_no_cors(tiny_server):
    response = httpx2.post(
        f"{tiny_server.url}/v1/chat/completions",
        json={"messages": HELLO, "max_tokens": 2},
        headers={"Origin": "https://evil.example", "content-type": "text/plain"},
        timeout=10,
    )
    assert response.status_code == 403
    assert "access-control-allow-origin" not in response.headers
    preflight = httpx2.options(
        f"{tiny_server.url}/v1/chat/completions", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}, timeout=10
    )
    assert "access-control-allow-origin" not in preflight.headers
    assert tiny_server.activity.records() == [] or all("evil" not in r.client for r in tiny_server.activity.records())


def test_a_configured_origin_gets_cors(keyed):
    preflight = httpx2.options(
        f"{keyed.url}/v1/chat/completions",
        headers={"Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"},
        timeout=10,
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "http://localhost:5173"
    other = httpx2.options(f"{keyed.url}/v1/chat/completions", headers={"Origin": "http://localhost:9999", "Access-Control-Request-Method": "POST"}, timeout=10)
    assert other.status_code == 403
