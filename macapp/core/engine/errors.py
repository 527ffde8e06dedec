"""The engine's one exception: a failure with a code from events.py and a message for people."""

from __future__ import annotations

from macapp.core import events as ev


class EngineError(Exception):
    """A failure with a code from events.py (NOT_FOUND, CORRUPT, CONTEXT_LIMIT, ...) and one actionable sentence."""

    def __init__(self, message: str, code: str = ev.ERROR):
        super().__init__(message)
        self.code = code
        self.message = message
