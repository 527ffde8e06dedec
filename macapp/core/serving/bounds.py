"""Refusing a prompt that cannot fit the context before tokenizing it whole (pure Python; no MLX).

Tokenizing a 10 MiB prompt takes seconds and gigabytes only to learn it is far over the context. Two cheaper
steps come first, each a safe *lower* bound of the token count (a prompt is refused only when it certainly
does not fit):

1. Bytes: every token stands for at most `max_token_bytes` bytes of the (NFC-normalised) text, the longest
   entry of the vocabulary, so a prompt holds at least ceil(bytes / max_token_bytes) tokens. Only the text the
   template surely writes out is counted (user, system and tool messages: an assistant turn's earlier reasoning
   may be dropped by it).
2. Pieces: the rendered prompt is tokenized a slice at a time, cut where no pre-token of Qwen's byte-level BPE
   crosses (after a newline or before a space, and before a letter), and counting stops as soon as the slices already hold more than
   the limit (with a few tokens of slack per cut), so a prompt over the limit costs about the limit's worth of
   tokenizing, not its own size. A prompt that fits is then tokenized whole, as before.
"""

from __future__ import annotations

import math
import re
import threading
import unicodedata
from typing import Iterator

from macapp.core.engine.model_folder import Tokenizer
from macapp.core.serving.render import render_text
from macapp.core.serving.requests import CompletionRequest, Role

PIECE_CHARS = 64 * 1024  # a slice's length before the cut looks for a safe place
SLACK_PER_CUT = 8  # tokens a cut is allowed to add, though none should at these cuts
_CUT = re.compile(r"(?<=\n)(?=[^\W\d_])|(?<=\S)(?= [^\W\d_])")  # [^\W\d_]: a letter
_SURELY_RENDERED = (Role.USER, Role.SYSTEM, Role.TOOL)

_lock = threading.Lock()
_max_bytes: dict[int, tuple[Tokenizer, int]] = {}  # id(tokenizer) -> (tokenizer, its longest token in bytes)


class PromptTooLong(ValueError):
    """The prompt certainly holds more tokens than the context limit; the message says so, for the client."""

    def __init__(self, at_least: int, limit: int):
        super().__init__(
            f"This prompt is at least {at_least:,} tokens, over the server's context limit of {limit:,} tokens: "
            "shorten the conversation (or start the server with a larger --context)."
        )
        self.at_least = at_least
        self.limit = limit


def max_token_bytes(tokenizer: Tokenizer) -> int:
    """The most bytes of text one token of `tokenizer` stands for (computed once per tokenizer). A vocabulary entry's
    UTF-8 length is never less than the bytes it stands for (byte-level BPE writes each byte as one character)."""
    with _lock:
        known = _max_bytes.get(id(tokenizer))
        if known is not None and known[0] is tokenizer:
            return known[1]
    vocab = tokenizer.get_vocab()
    longest = max((len(token.encode("utf-8", "surrogatepass")) for token in vocab), default=1)
    with _lock:
        _max_bytes[id(tokenizer)] = (tokenizer, max(1, longest))
    return max(1, longest)


def text_bytes(text: str) -> int:
    """The UTF-8 length of `text` as the tokenizer sees it (NFC, which may join characters; ends trimmed)."""
    text = text.strip()
    if not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    return len(text.encode("utf-8", "surrogatepass"))


def min_prompt_tokens(request: CompletionRequest, max_bytes: int) -> int:
    """A lower bound of the prompt's tokens from the bytes of the text the template surely writes."""
    total = sum(text_bytes(m.content) for m in request.messages if m.role in _SURELY_RENDERED)
    return math.ceil(total / max_bytes)


def check_bytes(request: CompletionRequest, context_limit: int, max_bytes: int) -> None:
    """PromptTooLong when the bytes alone prove the prompt leaves no room for a reply token."""
    at_least = min_prompt_tokens(request, max_bytes)
    if at_least + 1 > context_limit:
        raise PromptTooLong(at_least, context_limit)


def pieces(text: str, size: int = PIECE_CHARS) -> Iterator[str]:
    """`text` in slices of at least `size` characters, each cut where no pre-token crosses: after a newline before a
    letter, or before a space that follows a non-space and precedes a letter (Qwen's pre-tokenizer starts a word
    there either way). Never elsewhere: a text without such a place stays one slice."""
    at = 0
    while len(text) - at > size:
        match = _CUT.search(text, at + size)
        if match is None:
            break
        yield text[at : match.start()]
        at = match.start()
    yield text[at:]


def prompt_exceeds(tokenizer: Tokenizer, text: str, limit: int, size: int = PIECE_CHARS) -> int | None:
    """A lower bound of the tokens in `text` once it is proved over `limit`, else None (counting stops there)."""
    if len(text) <= size:
        return None  # one slice: the whole tokenization is as cheap
    counted = 0
    for cuts, piece in enumerate(pieces(text, size), start=1):  # each piece may end at a cut
        counted += len(tokenizer.encode(piece, add_special_tokens=False))
        at_least = counted - cuts * SLACK_PER_CUT
        if at_least > limit:
            return at_least
    return None


def check_prompt(tokenizer: Tokenizer, request: CompletionRequest, context_limit: int) -> None:
    """PromptTooLong when the prompt of `request` certainly leaves no room in `context_limit` tokens, found
    without tokenizing more than about the limit's worth of it (any thread: only the tokenizer is read).
    A RenderError from the template goes up as render would raise it."""
    if context_limit <= 0:
        return
    check_bytes(request, context_limit, max_token_bytes(tokenizer))
    at_least = prompt_exceeds(tokenizer, render_text(tokenizer, request), context_limit - 1)
    if at_least is not None:
        raise PromptTooLong(at_least, context_limit)
