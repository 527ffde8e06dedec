"""The front door's decisions on recorded headers (the live server's answers: tests/server/test_http_security.py)."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from macapp.server.config import ServerConfig, is_loopback
from macapp.server.errors import ErrorKind
from macapp.server.security import SecurityPolicy, check_request, host_name, presented_key


def check(policy, path="/v1/chat/completions", method="POST", **headers):
    return check_request(policy, path, method, Headers({k.replace("_", "-"): v for k, v in headers.items()}))


@pytest.mark.parametrize(
    ("header", "name"),
    [("localhost:8642", "localhost"), ("127.0.0.1", "127.0.0.1"), ("[::1]:8642", "::1"), ("evil.example:80", "evil.example"), ("::1", "::1")],
)
def test_host_name(header, name):
    assert host_name(header) == name


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.5.6.7", "::1", "[::1]", "app.localhost"])
def test_loopback_names(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.4", "evil.example", "localhost.evil.example", ""])
def test_not_loopback(host):
    assert not is_loopback(host)


def test_foreign_host_is_refused_on_loopback_and_beyond():
    loopback = SecurityPolicy.from_config(ServerConfig(host="127.0.0.1"))
    assert check(loopback, host="127.0.0.1:8642") is None
    assert check(loopback, host="localhost:8642") is None
    refused = check(loopback, host="rebind.example:8642")
    assert refused.kind is ErrorKind.PERMISSION and "--allow-host rebind.example" in refused.message
    network = SecurityPolicy.from_config(ServerConfig(host="0.0.0.0"))  # the Host check stays on (tests/server/test_hosts.py)
    assert check(network, host="rebind.example:8642").kind is ErrorKind.PERMISSION


def test_browser_origins_are_refused_unless_configured():
    policy = SecurityPolicy(allowed_origins=("http://localhost:3000",))
    assert check(policy, host="localhost", origin="http://localhost:3000") is None
    assert check(policy, host="localhost", origin="https://evil.example").kind is ErrorKind.PERMISSION
    assert check(SecurityPolicy(), host="localhost", origin="http://localhost:3000").kind is ErrorKind.PERMISSION
    assert check(SecurityPolicy(), host="localhost", origin="null").kind is ErrorKind.PERMISSION


def test_api_key_from_bearer_or_x_api_key():
    policy = SecurityPolicy(api_key="s3cret")
    assert check(policy, host="localhost", authorization="Bearer s3cret") is None
    assert check(policy, host="localhost", x_api_key="s3cret") is None
    for headers in ({}, {"authorization": "Bearer wrong"}, {"x_api_key": "s3cre"}, {"authorization": "Basic s3cret"}):
        error = check(policy, host="localhost", **headers)
        assert error.kind is ErrorKind.AUTHENTICATION and error.code == "invalid_api_key"
    assert check(policy, path="/health", method="GET", host="localhost").kind is ErrorKind.AUTHENTICATION
    assert check(policy, path="/health", method="GET", host="localhost", x_api_key="s3cret") is None


def test_presented_key_prefers_bearer():
    assert presented_key(Headers({"authorization": "Bearer a", "x-api-key": "b"})) == "a"
    assert presented_key(Headers({"x-api-key": "b"})) == "b"
    assert presented_key(Headers({})) is None


def test_declared_body_over_the_limit_is_413():
    policy = SecurityPolicy(max_body_bytes=1000)
    assert check(policy, host="localhost", content_length="1000") is None
    assert check(policy, host="localhost", content_length="1001").kind is ErrorKind.TOO_LARGE
