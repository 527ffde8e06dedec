"""The local API server as an object: uvicorn on its own thread (never the Qt event loop, never the engine's).

    server = LocalServer(backend, ServerConfig(port=0))
    url = server.start()        # binds (OSError with the reason if it cannot), returns the base URL when serving
    ...
    server.stop()               # stops every request in flight, lets their replies end, joins the thread

The socket is bound here, in the caller's thread, so "port in use" is an exception with a clear message rather
than a log line on a thread that then dies.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading

import uvicorn

from macapp.server.activity import Activity
from macapp.server.app import create_app
from macapp.server.completion import Backend
from macapp.server.config import ServerConfig

log = logging.getLogger(__name__)
GRACE_S = 3  # how long stopped replies get to send their last events before connections are dropped


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free one); OSError with an actionable message."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise OSError(f"cannot bind to {host!r}: {exc.strerror or exc}") from exc
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        hint = " (another program is using it: choose another with --port)" if exc.errno in (48, 98) else ""
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}{hint}") from exc
    sock.set_inheritable(True)
    return sock


class LocalServer:
    def __init__(self, backend: Backend, config: ServerConfig, activity: Activity | None = None):
        self.backend = backend
        self.config = config
        self.activity = activity or Activity()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def port(self) -> int | None:
        return self._port

    @property
    def base_url(self) -> str:
        return self.config.base_url(self._port)

    def start(self, timeout: float = 15.0) -> str:
        if self.running:
            return self.base_url
        sock = bind_socket(self.config.host, self.config.port)
        self._port = sock.getsockname()[1]
        self.activity.open()
        app = create_app(self.backend, self.config, self.activity)
        uv_config = uvicorn.Config(
            app,
            loop="asyncio",
            http="h11",
            ws="none",
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=GRACE_S,
            timeout_keep_alive=30,
        )
        self._server = server = uvicorn.Server(uv_config)
        self._thread = threading.Thread(target=self._serve, args=(server, sock), name="qwen-desk-server", daemon=True)
        self._thread.start()
        waited = 0.0
        while not server.started:
            if not self._thread.is_alive():
                raise OSError(f"the server on {self.base_url} stopped while starting (see the log)")
            if waited >= timeout:
                self.stop()
                raise OSError(f"the server on {self.base_url} did not start within {timeout:.0f} s")
            self._thread.join(0.02)
            waited += 0.02
        return self.base_url

    @staticmethod
    def _serve(server: uvicorn.Server, sock: socket.socket) -> None:
        try:
            asyncio.run(server.serve(sockets=[sock]))
        except BaseException:  # noqa: BLE001 - the thread's end is what start()/stop() see; say why in the log
            log.exception("the local API server stopped")
        finally:
            sock.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop all requests in flight, then the server; returns when it is down. A reply cut short ends with an error
        in its API's shape (503 before it began, an error event in a stream), never as a finished answer; a request
        arriving meanwhile gets 503 with Retry-After."""
        self.activity.shut_down()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(timeout)
        self._thread = None
        self._server = None
