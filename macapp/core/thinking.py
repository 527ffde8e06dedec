"""Split a streamed reply into reasoning and answer, as the text arrives (pure; no MLX).

Qwen3.5 with thinking on is prompted with ``<think>\\n`` already written, so its stream starts *inside*
the reasoning and ends it with ``</think>``; with thinking off the template writes an empty think block
and the stream is all answer. Tags may arrive split across tokens (``</thi`` + ``nk>``), so a possible tag
prefix at the end of a piece is held back until the next piece decides it. Whitespace the template puts
around the tags (the newline before ``</think>``, the blank line after it) is not part of either text.
A reply that never closes its reasoning is all reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"

REASONING = "reasoning"
ANSWER = "answer"


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper prefix of `tag` (0 if none)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


@dataclass
class ThinkingSplitter:
    """Feed text pieces; get (kind, text) pieces back. `in_reasoning` says where the stream is now."""

    in_reasoning: bool = False
    open_tag: str = OPEN_TAG
    close_tag: str = CLOSE_TAG
    closed: bool = False  # a closing tag was seen
    _held: str = ""  # a possible tag prefix or newlines whose fate the next piece decides
    _answer_started: bool = False  # any non-blank answer text emitted yet
    _reasoning_started: bool = False
    reasoning: list[str] = field(default_factory=list)
    answer: list[str] = field(default_factory=list)

    def feed(self, text: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        buf = self._held + text
        self._held = ""
        while buf:
            if self.in_reasoning:
                i = buf.find(self.close_tag)
                if i >= 0:
                    self._emit_reasoning(buf[:i].rstrip("\n"), out)
                    buf = buf[i + len(self.close_tag) :]
                    self.in_reasoning = False
                    self.closed = True
                    continue
                keep = _partial_suffix(buf, self.close_tag)
                body, tail = buf[: len(buf) - keep], buf[len(buf) - keep :]
                stripped = body.rstrip("\n")  # newlines just before </think> belong to the template
                self._emit_reasoning(stripped, out)
                self._held = body[len(stripped) :] + tail
                return out
            # answer side
            if not self._answer_started:
                buf = buf.lstrip("\n")
                if not buf:
                    return out
                if not self.closed and buf.startswith(self.open_tag):
                    # a model that writes its own opening tag (thinking not pre-opened by the template)
                    buf = buf[len(self.open_tag) :]
                    self.in_reasoning = True
                    continue
                if not self.closed and self.open_tag.startswith(buf):
                    self._held = buf
                    return out
            i = buf.find(self.close_tag)
            if i >= 0:  # a stray closing tag in the answer is dropped
                self._emit_answer(buf[:i], out)
                buf = buf[i + len(self.close_tag) :]
                continue
            keep = _partial_suffix(buf, self.close_tag)
            self._emit_answer(buf[: len(buf) - keep], out)
            self._held = buf[len(buf) - keep :]
            return out
        return out

    def flush(self) -> list[tuple[str, str]]:
        """The end of the stream: release what was held back (a half tag is just text after all)."""
        held, self._held = self._held, ""
        out: list[tuple[str, str]] = []
        if self.in_reasoning:
            self._emit_reasoning(held.rstrip("\n"), out)
        elif self._answer_started or held.strip("\n"):
            self._emit_answer(held if self._answer_started else held.lstrip("\n"), out)
        return out

    def _emit_reasoning(self, text: str, out: list[tuple[str, str]]) -> None:
        if not self._reasoning_started:
            text = text.lstrip("\n")
        if text:
            self._reasoning_started = True
            self.reasoning.append(text)
            out.append((REASONING, text))

    def _emit_answer(self, text: str, out: list[tuple[str, str]]) -> None:
        if text:
            self._answer_started = True
            self.answer.append(text)
            out.append((ANSWER, text))

    @property
    def reasoning_text(self) -> str:
        return "".join(self.reasoning)

    @property
    def answer_text(self) -> str:
        return "".join(self.answer)
