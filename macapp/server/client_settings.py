"""What other tools need to use the server: the OpenAI base URL, and Claude Code's settings-file `env` block.

`CLAUDE_CODE_ATTRIBUTION_HEADER: "0"` keeps Claude Code's system prompt the same from request to request (its
attribution header changes otherwise, which defeats every prompt cache); users report that it must be in the
settings file, the shell variable alone is not enough.
"""

from __future__ import annotations

import json

NO_KEY = "qwen-desk"  # clients insist on some key; the server ignores it when it has none


def claude_code_env(base_url: str, api_key: str | None, model: str) -> dict[str, str]:
    return {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_AUTH_TOKEN": api_key or NO_KEY,
        "ANTHROPIC_MODEL": model,
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
    }


def client_settings(base_url: str, api_key: str | None, model: str) -> str:
    """Text for the clipboard: the OpenAI settings and the `env` block for ~/.claude/settings.json."""
    settings = json.dumps({"env": claude_code_env(base_url, api_key, model)}, indent=2)
    return (
        "# OpenAI-compatible tools\n"
        f"OPENAI_BASE_URL={base_url}/v1\n"
        f"OPENAI_API_KEY={api_key or NO_KEY}\n"
        "\n"
        "# Claude Code: put this in ~/.claude/settings.json\n"
        f"{settings}\n"
    )
