"""uvicorn on its own thread: binding errors are exceptions with the reason; stop joins the thread and frees the port."""

from __future__ import annotations

import socket

import httpx2
import pytest

from macapp.server.config import ServerConfig
from macapp.server.local_server import LocalServer, bind_socket


def test_a_port_in_use_is_an_oserror_saying_what_to_do():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(OSError, match="choose another with --port"):
            bind_socket("127.0.0.1", taken.getsockname()[1])


def test_an_unknown_host_is_an_oserror():
    with pytest.raises(OSError, match="cannot bind"):
        bind_socket("no-such-host.invalid", 0)


def test_start_serves_on_the_bound_port_and_stop_frees_it(tiny_server):
    server = LocalServer(tiny_server.backend, ServerConfig(port=0))
    url = server.start()
    assert server.running and url == f"http://127.0.0.1:{server.port}"
    assert server.start() == url  # already running: the same server
    assert httpx2.get(f"{url}/health", timeout=10).json()["model"] == tiny_server.backend.model_name
    server.stop()
    assert not server.running
    with pytest.raises(httpx2.ConnectError):
        httpx2.get(f"{url}/health", timeout=5)
    bind_socket("127.0.0.1", server.port).close()  # the port is free again
