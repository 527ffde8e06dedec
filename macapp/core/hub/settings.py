"""The hub settings, read from the environment at each call with huggingface_hub's own rules.

huggingface_hub reads them once, at import (`huggingface_hub.constants`); the app reads them per call so a change
(a test's hub stand-in, the window's offline switch) applies at once, but by the same rules:

- endpoint: ``HF_ENDPOINT`` with trailing slashes removed, default https://huggingface.co; the staging hub when
  ``HUGGINGFACE_CO_STAGING`` is true;
- offline: ``HF_HUB_OFFLINE``, else ``TRANSFORMERS_OFFLINE``, true when it is one of 1/ON/YES/TRUE (any case);
- the cache: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub`` (`hub_cache_dir`).

Importing this module loads no huggingface_hub (the fit, which names the hub's records, stays light).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ENDPOINT = "https://huggingface.co"
STAGING_ENDPOINT = "https://hub-ci.huggingface.co"


def _is_true(value: str | None) -> bool:
    from huggingface_hub.constants import ENV_VARS_TRUE_VALUES

    return value is not None and value.upper() in ENV_VARS_TRUE_VALUES


@dataclass(frozen=True)
class HubSettings:
    endpoint: str  # no trailing slash
    offline: bool
    endpoint_set: bool  # HF_ENDPOINT (or staging) chose it, rather than the default

    @property
    def host_label(self) -> str:
        """What to name in a message: the endpoint when one was set, else huggingface.co."""
        return self.endpoint if self.endpoint_set else "huggingface.co"


def hub_settings() -> HubSettings:
    if _is_true(os.environ.get("HUGGINGFACE_CO_STAGING")):
        endpoint, chosen = STAGING_ENDPOINT, True
    else:
        raw = os.environ.get("HF_ENDPOINT")
        endpoint, chosen = (raw.rstrip("/"), True) if raw else (DEFAULT_ENDPOINT, False)
    offline = _is_true(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))
    return HubSettings(endpoint=endpoint, offline=offline, endpoint_set=chosen)


def hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP check of the hub's host, so an offline machine fails in seconds, not after the client's retries."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(hub_settings().endpoint)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def hub_cache_dir() -> Path:
    """$HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub (read now, not at import)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(os.path.expandvars(explicit)).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"
