"""The settings other tools need, as copied by the window."""

from __future__ import annotations

import json

from macapp.server.client_settings import claude_code_env, client_settings


def test_claude_code_env_block():
    env = claude_code_env("http://127.0.0.1:8642", "k", "mlx-community/Qwen3.5-35B-A3B-4bit")
    assert env == {
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:8642",
        "ANTHROPIC_AUTH_TOKEN": "k",
        "ANTHROPIC_MODEL": "mlx-community/Qwen3.5-35B-A3B-4bit",
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
    }


def test_clipboard_text_has_openai_base_url_and_a_valid_settings_json():
    text = client_settings("http://127.0.0.1:8642", None, "m")
    assert "OPENAI_BASE_URL=http://127.0.0.1:8642/v1" in text
    settings = json.loads(text[text.index("{") :])
    assert settings["env"]["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8642"  # no /v1: Claude Code adds it
    assert settings["env"]["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
