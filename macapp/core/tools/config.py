"""The MCP servers the user listed: `<app home>/mcp.json` in Claude Desktop's format, read and checked.

    {"mcpServers": {"files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
                              "env": {"TOKEN": "…"}},
                    "search": {"url": "http://127.0.0.1:8931/mcp"}}}

A server has either a `command` (stdio: `args`, `env`, `cwd` optional) or a `url` (streamable HTTP). Anything else
is a ConfigError naming the file and the problem; no file at all is no servers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from macapp.core.paths import app_home

CONFIG_NAME = "mcp.json"


class ConfigError(ValueError):
    """The config file cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class ServerConfig:
    name: str
    command: str | None = None  # stdio
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, repr=False, compare=False)  # secrets: never in a repr or a log
    cwd: str | None = None
    url: str | None = None  # streamable HTTP

    @property
    def transport(self) -> str:
        return "http" if self.url is not None else "stdio"

    def describe(self) -> str:
        """What runs, for the Tools pane and the logs (the `env` values are left out: they may be secrets)."""
        return self.url if self.url is not None else " ".join([self.command or "", *self.args])


def config_path() -> Path:
    """`$QWEN_DESK_HOME/mcp.json` when set, else the app home's."""
    return app_home() / CONFIG_NAME


def read_config(path: Path | None = None) -> list[ServerConfig]:
    """The servers in `path` (default config_path()), in the file's order; [] when the file does not exist."""
    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc}).") from exc
    return parse_config(text, str(path))


def parse_config(text: str, where: str) -> list[ServerConfig]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc}).") from exc
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers", {}), dict):
        raise ConfigError(f'{where}: expected an object {{"mcpServers": {{"NAME": {{"command": …}} or {{"url": …}}}}}}.')
    servers = data.get("mcpServers", {})
    return [_server(name, entry, where) for name, entry in servers.items()]


def _server(name: str, entry: object, where: str) -> ServerConfig:
    def bad(problem: str) -> ConfigError:
        return ConfigError(f'{where}: server "{name}": {problem}')

    if not name or "/" in name:
        raise bad("a server's name must be non-empty and hold no '/'.")
    if not isinstance(entry, dict):
        raise bad('expected an object with "command" (a program to run) or "url" (an HTTP server).')
    command, url = entry.get("command"), entry.get("url")
    if (command is None) == (url is None):
        raise bad('give either "command" (a program to run) or "url" (an HTTP server), not both nor neither.')
    if url is not None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise bad('"url" must be an http:// or https:// address.')
        return ServerConfig(name, url=url)
    if not isinstance(command, str) or not command.strip():
        raise bad('"command" must be a non-empty string.')
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise bad('"args" must be a list of strings.')
    env = entry.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise bad('"env" must be an object of string values.')
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise bad('"cwd" must be a string.')
    return ServerConfig(name, command=command, args=tuple(args), env=dict(env), cwd=cwd)
