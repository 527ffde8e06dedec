"""Stop sequences on streamed answer text (pure): text up to the first match goes out, the match and the rest never.

Only what may be the start of a stop sequence is held back, until the next piece decides it.
"""

from __future__ import annotations

from typing import Sequence


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper prefix of `tag` (0 if none)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class StopMatcher:
    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self.matched: str | None = None  # the stop sequence that ended the text
        self._held = ""

    def feed(self, text: str) -> str:
        """The part of `text` (after what was held) that can go out now; "" once a stop sequence matched."""
        if self.matched is not None:
            return ""
        buf = self._held + text
        self._held = ""
        if not self.stops:
            return buf
        hits = [(i, s) for s in self.stops if (i := buf.find(s)) >= 0]
        if hits:
            at, self.matched = min(hits, key=lambda hit: (hit[0], -len(hit[1])))
            return buf[:at]
        keep = max((partial_suffix(buf, s) for s in self.stops), default=0)
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """The end of the text: what was held back was no stop sequence after all."""
        held, self._held = self._held, ""
        return "" if self.matched is not None else held
