"""A chat message in the engine's shape: the JSON-like dict Qwen3.5's chat template reads.

{"role", "content"}; a reply also carries "reasoning", "thinking", "finish_reason" and "cache_tokens" (its tokens
as the session's cache held them, when known: turns.replay reads them); a message with pictures carries them
under "images". It stays a dict because it is handed as such to the tokenizer's chat template
and, through `ChatSession.messages`, to the front ends.
"""

from __future__ import annotations

from typing import Any

ChatMessage = dict[str, Any]
