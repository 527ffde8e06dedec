"""The MCP host: the user's servers (config.py), started when first needed, kept for the app's run, stopped with it.

The SDK is async; the host owns one asyncio loop on a thread of its own, and every server lives there as one task
that holds its `Client` open (entered and left by that task, as anyio wants) until `close()`. The front ends call
it from any other thread and wait:

    host = McpHost(read_config())
    warnings = host.start()                    # once: every server up, or failed with a warning naming it
    host.tools()                               # HostTool: server, MCP name, the name offered to the model
    outcome = host.call(tool, {"path": "/tmp"})  # CallOutcome: text, is_error, timed_out, elapsed_s
    host.close()                               # every server stopped, its processes included (guard.py)

Names: each tool is offered under its own MCP name; only a name that two servers share is offered as
`SERVER__NAME` (the server's name made safe for the tool format).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import re
import shutil
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Coroutine, Mapping, TextIO, TypeVar

from macapp.core.jsonvalue import JSONObject
from macapp.core.paths import logs_dir
from macapp.core.serving.requests import ToolSpec
from macapp.core.tools.config import ServerConfig
from macapp.core.tools.results import content_text

if TYPE_CHECKING:  # the SDK itself is imported when a server starts: about a second that `chat` without tools never pays
    from mcp import Client
    from mcp.client._transport import Transport

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 60.0  # a tool call
START_TIMEOUT_S = 30.0  # a server's start and handshake
GUARD = Path(__file__).with_name("guard.py")
SERVER_LOG = "mcp-servers.log"  # the servers' stderr when the app has no terminal
REQUEST_TIMEOUT = -32001  # the SDK's MCPError code for a request that got no answer in time
T = TypeVar("T")


class ServerState(enum.StrEnum):
    IDLE = "not started"
    STARTING = "starting"
    RUNNING = "running"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(frozen=True)
class HostTool:
    server: str
    name: str  # the server's own name for it (what call_tool gets)
    offered: str  # the name the model sees and calls
    description: str = ""
    input_schema: JSONObject = field(default_factory=dict)

    def spec(self) -> ToolSpec:
        return ToolSpec(self.offered, self.description, self.input_schema)


@dataclass(frozen=True)
class CallOutcome:
    text: str  # the result's text as the tool gave it (not cut; results.for_prompt makes the prompt's copy)
    is_error: bool = False
    timed_out: bool = False
    elapsed_s: float = 0.0


@dataclass
class ServerStatus:
    """One server as the Tools pane shows it."""

    config: ServerConfig
    state: ServerState = ServerState.IDLE
    error: str | None = None
    tools: tuple[HostTool, ...] = ()


class _Server:
    def __init__(self, config: ServerConfig) -> None:
        self.status = ServerStatus(config)
        self.client: Client | None = None
        self.raw_tools: list[tuple[str, str, JSONObject]] = []
        self.ready = threading.Event()
        self.stop: asyncio.Event | None = None
        self.task: asyncio.Task[None] | None = None


def _unwrap(exc: BaseException) -> BaseException:
    """The first leaf of nested ExceptionGroups (the SDK's task groups wrap what went wrong)."""
    while (inner := getattr(exc, "exceptions", None)) and isinstance(inner[0], BaseException):  # ExceptionGroup
        exc = inner[0]
    return exc


def _why(exc: BaseException) -> str:
    from mcp import MCPError

    leaf = _unwrap(exc)
    if isinstance(leaf, MCPError) and leaf.code == -32000:
        return f"it exited at start (see its output above, or {SERVER_LOG} in the logs folder)"
    return str(leaf) or type(leaf).__name__


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


class McpHost:
    def __init__(self, servers: list[ServerConfig], timeout_s: float = DEFAULT_TIMEOUT_S, start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self._servers = {s.name: _Server(s) for s in servers}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = False
        self._closed = False
        self._tools: dict[str, HostTool] = {}
        self._listeners: list[Callable[[], None]] = []
        self.warnings: list[str] = []
        self._server_log: TextIO | None = None

    # -- what it holds
    @property
    def configured(self) -> bool:
        return bool(self._servers)

    @property
    def started(self) -> bool:
        return self._started

    def servers(self) -> list[ServerStatus]:
        return [s.status for s in self._servers.values()]

    def tools(self) -> list[HostTool]:
        return list(self._tools.values())

    def find(self, offered: str) -> HostTool | None:
        return self._tools.get(offered)

    def add_listener(self, callback: Callable[[], None]) -> None:
        """`callback()` after a server's state changes (on the host's thread: it must be quick)."""
        self._listeners.append(callback)

    # -- life
    def start(self) -> list[str]:
        """Start every server (once; later calls return at once) and wait until each is up or failed; returns the
        warnings (one per server that failed, naming it); the chat goes on without those servers' tools."""
        with self._lock:
            if self._started or self._closed:
                return list(self.warnings)
            self._started = True
            if not self._servers:
                return []
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="qwen-desk-mcp", daemon=True)
            self._thread.start()
            for server in self._servers.values():
                self._submit(self._open(server))
        deadline = time.monotonic() + self.start_timeout_s
        for server in self._servers.values():
            if not server.ready.wait(max(0.0, deadline - time.monotonic())):
                self._fail(server, f"it did not answer within {self.start_timeout_s:g} s")
                if server.task is not None and self._loop is not None:
                    self._loop.call_soon_threadsafe(server.task.cancel)
        self._name_tools()
        for server in self._servers.values():
            if server.status.state is ServerState.FAILED:
                self.warnings.append(f'MCP server "{server.status.config.name}" is not available: {server.status.error}. The chat goes on without its tools.')
        for warning in self.warnings:
            log.info("%s", warning)
        return list(self.warnings)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop every server (their processes too) and the host's thread; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop = self._loop
        if loop is None:
            return
        tasks = []
        for server in self._servers.values():
            if server.stop is not None:
                loop.call_soon_threadsafe(server.stop.set)
            if server.task is not None:
                tasks.append(server.task)

        async def drained() -> None:
            await asyncio.wait(tasks, timeout=timeout_s) if tasks else None

        try:
            asyncio.run_coroutine_threadsafe(drained(), loop).result(timeout_s + 1)
        except (FutureTimeout, RuntimeError):
            log.warning("MCP servers did not all stop within %g s", timeout_s)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout_s)
        loop.close()
        if self._server_log is not None:
            self._server_log.close()

    def __enter__(self) -> McpHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls
    def call(self, tool: HostTool, arguments: Mapping[str, object], timeout_s: float | None = None) -> CallOutcome:
        """Run `tool` with `arguments` (blocking; any thread but the host's); a timeout or a failure comes back as
        an error outcome whose text says what happened, never as an exception."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        server = self._servers.get(tool.server)
        started = time.monotonic()
        if server is None or server.client is None or server.status.state is not ServerState.RUNNING:
            return CallOutcome(f'The MCP server "{tool.server}" is not running.', is_error=True)
        future = self._submit(server.client.call_tool(tool.name, dict(arguments), read_timeout_seconds=timeout))
        try:
            result = future.result(timeout + 5.0)
        except (FutureTimeout, TimeoutError):
            future.cancel()
            return CallOutcome(f"The tool did not answer within {timeout:g} s.", is_error=True, timed_out=True, elapsed_s=time.monotonic() - started)
        except Exception as exc:  # noqa: BLE001 - any failure of the call is the model's to hear about
            from mcp import MCPError

            leaf = _unwrap(exc)
            elapsed = time.monotonic() - started
            if isinstance(leaf, MCPError) and leaf.code == REQUEST_TIMEOUT:
                return CallOutcome(f"The tool did not answer within {timeout:g} s.", is_error=True, timed_out=True, elapsed_s=elapsed)
            return CallOutcome(f"The call failed: {_why(leaf)}", is_error=True, elapsed_s=elapsed)
        text = content_text(result.content, result.structured_content)
        return CallOutcome(text, is_error=bool(result.is_error), elapsed_s=time.monotonic() - started)

    # -- the host's thread
    def _submit(self, coro: Coroutine[object, None, T]) -> Future[T]:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _set(self, server: _Server, state: ServerState, error: str | None = None) -> None:
        server.status.state = state
        if error is not None:
            server.status.error = error
        for callback in list(self._listeners):
            try:
                callback()
            except Exception:
                log.exception("MCP host listener failed")

    def _fail(self, server: _Server, why: str) -> None:
        if server.status.state in (ServerState.IDLE, ServerState.STARTING):
            self._set(server, ServerState.FAILED, why)
        server.ready.set()

    def _target(self, config: ServerConfig) -> Transport | str:
        from mcp import StdioServerParameters, stdio_client

        if config.url is not None:
            return config.url
        assert config.command is not None
        path = config.env.get("PATH", os.environ.get("PATH"))
        if shutil.which(config.command, path=path) is None:
            raise FileNotFoundError(f"its command {config.command!r} was not found")
        params = StdioServerParameters(command=sys.executable, args=[str(GUARD), config.command, *config.args], env=dict(config.env) or None, cwd=config.cwd)
        return stdio_client(params, errlog=self._errlog())

    def _errlog(self) -> TextIO:
        """Where the servers' own output (stderr) goes: ours when it is a real file (the terminal), else a log file."""
        try:
            sys.stderr.fileno()
            return sys.stderr
        except (AttributeError, OSError, ValueError):
            if self._server_log is None:
                logs_dir().mkdir(parents=True, exist_ok=True)
                self._server_log = open(logs_dir() / SERVER_LOG, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
            return self._server_log

    async def _open(self, server: _Server) -> None:
        from mcp import Client

        server.task = asyncio.current_task()
        server.stop = asyncio.Event()
        self._set(server, ServerState.STARTING)
        try:
            target = self._target(server.status.config)
            async with Client(target) as client:
                raw: list[tuple[str, str, JSONObject]] = []
                cursor: str | None = None
                while True:
                    listed = await client.list_tools(cursor=cursor)
                    raw += [(t.name, t.description or "", dict(t.input_schema or {})) for t in listed.tools]
                    cursor = listed.next_cursor
                    if not cursor:
                        break
                server.raw_tools, server.client = raw, client
                self._set(server, ServerState.RUNNING)
                server.ready.set()
                await server.stop.wait()
                server.client = None
            self._set(server, ServerState.STOPPED)
        except asyncio.CancelledError:
            server.client = None
            self._fail(server, server.status.error or "it was stopped before it was ready")
        except BaseException as exc:  # noqa: BLE001 - a server's failure is a warning, the chat goes on
            server.client = None
            if server.status.state is ServerState.RUNNING:
                self._set(server, ServerState.FAILED, _why(exc))
            self._fail(server, _why(exc))
            log.debug("MCP server %s failed", server.status.config.name, exc_info=True)

    def _name_tools(self) -> None:
        counts: dict[str, int] = {}
        running = [s for s in self._servers.values() if s.status.state is ServerState.RUNNING]
        for server in running:
            for name, _, _ in server.raw_tools:
                counts[name] = counts.get(name, 0) + 1
        tools: dict[str, HostTool] = {}
        for server in running:
            own = []
            for name, description, schema in server.raw_tools:
                offered = name if counts[name] == 1 else f"{_safe(server.status.config.name)}__{name}"
                tool = HostTool(server.status.config.name, name, offered, description, schema)
                tools[offered] = tool
                own.append(tool)
            server.status.tools = tuple(own)
        self._tools = tools
