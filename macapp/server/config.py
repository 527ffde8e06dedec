"""How the local API server is set up: address, key, allowed origins, limits, defaults."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import sys
from dataclasses import dataclass

# Clear of the other local runners: Ollama 11434, LM Studio 1234, llama.cpp / mlx-lm 8080, vLLM 8000,
# claude-code-router 3456, Jan 1337.
DEFAULT_PORT = 8642
DEFAULT_HOST = "127.0.0.1"
MAX_BODY_BYTES = 32 * 1024 * 1024  # agents' requests run to several hundred KB; images more
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    """True for 'localhost', a 127.x address or ::1 (what a bind or a Host header may name)."""
    host = host.strip().strip("[]").lower()
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def normal_host(name: str) -> str:
    """A host name or address as compared: lower case, no brackets, no trailing dot, no IPv6 zone ('%en0')."""
    name = name.strip().strip("[]").lower().rstrip(".")
    return name.split("%", 1)[0] if ":" in name else name


def machine_names() -> frozenset[str]:
    """This machine's own names and addresses, as a client on the network may write them in a Host header: its host
    name (short, full, and NAME.local, the Bonjour name macOS answers to) and every address of its interfaces."""
    names: set[str] = set()
    candidates = [socket.gethostname(), socket.getfqdn()]
    if sys.platform == "darwin":  # the Bonjour name (System Settings > Sharing) can differ from the host name
        try:
            candidates.append(subprocess.run(["scutil", "--get", "LocalHostName"], capture_output=True, text=True, timeout=2).stdout)
        except (OSError, subprocess.SubprocessError):
            pass
    for candidate in candidates:
        name = normal_host(candidate or "")
        if name:
            short = name.split(".", 1)[0]
            names.update({name, short, f"{short}.local"})
    try:
        import psutil

        names.update(normal_host(a.address) for addrs in psutil.net_if_addrs().values() for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6))
    except (ImportError, OSError):
        pass
    return frozenset(n for n in names if n)


def url_host(host: str) -> str:
    """A host as it goes into a URL: IPv6 in brackets; 0.0.0.0 / :: shown as this machine's loopback."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True)
class ServerConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT  # 0: any free port (tests)
    api_key: str | None = None  # every request must carry it (Authorization: Bearer, or x-api-key)
    allowed_origins: tuple[str, ...] = ()  # browser origins let in (CORS); none by default
    allowed_hosts: tuple[str, ...] = ()  # Host names accepted beyond loopback (and, bound beyond it, this machine's); "*": any
    default_thinking: bool = True  # for an OpenAI request that does not say; Anthropic's is off, as its own API's is
    max_body_bytes: int = MAX_BODY_BYTES
    keepalive_s: float = 5.0  # an idle stream (a long prefill, a queue) gets a keep-alive this often
    first_event_wait_s: float = 1.0  # a stream waits this long for a quick refusal before it starts its 200
    queue_limit: int = 8  # requests waiting for the engine beyond the one it runs; more get 429

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def base_url(self, port: int | None = None) -> str:
        return f"http://{url_host(self.host)}:{port if port is not None else self.port}"
