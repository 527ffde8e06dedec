"""Shared fixtures for the history package's tests: a store on a real SQLite file, a sample conversation."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from macapp.core.history import Store


@pytest.fixture
def store(tmp_path):
    with Store.open(tmp_path / "history.sqlite3") as s:
        yield s


def _add_sourdough(s: Store, first="How do I bake sourdough bread at home?", reasoning="The user wants a recipe.") -> int:
    conv = s.create_conversation("Qwen3.5-0.8B", "You are concise.", {"temperature": 0.6, "thinking": True})
    s.add_message(conv.id, "user", first)
    writer = s.begin_reply(conv.id, thinking=True, model="Qwen3.5-0.8B")
    writer.append(reasoning=reasoning)
    writer.append("Mix flour, water, salt and starter; ")
    writer.append("proof overnight, bake at 250 °C.")
    writer.finish(
        {
            "ttft_s": 0.31,
            "prompt_tokens": 40,
            "prompt_tps": 400.0,
            "generation_tokens": 24,
            "generation_tps": 35.5,
            "reasoning_tokens": 6,
            "peak_memory_bytes": 2_100_000_000,
        },
        "stop",
    )
    return conv.id


@pytest.fixture
def sourdough():
    """Adds a two-message conversation (with reasoning and full stats) to a store; returns its id."""
    return _add_sourdough


@pytest.fixture
def committed():
    """What another connection reads of one message: (content, reasoning, state)."""

    def read(path: Path, message_id: int):
        conn = sqlite3.connect(path)
        try:
            return conn.execute("SELECT content, reasoning, state FROM messages WHERE id = ?", (message_id,)).fetchone()
        finally:
            conn.close()

    return read


def pragma(path: Path, name: str):
    """One PRAGMA's value as another connection to the file sees it."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]
    finally:
        conn.close()


@pytest.fixture
def outside():
    """`outside(path, pragma)`: a PRAGMA read through a separate connection (what any other process sees)."""
    return pragma
