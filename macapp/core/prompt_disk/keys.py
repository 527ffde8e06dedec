"""A checkpoint's key on disk: the SHA-256 of its token prefix (token ids; a picture's tokens are its digest)."""

from __future__ import annotations

import hashlib
from typing import Iterable, Sequence


def _piece(tokens: Sequence[int | str]) -> bytes:
    return "".join(f"{t!r}\x1f" for t in tokens).encode()


def digest(tokens: Sequence[int | str]) -> str:
    return hashlib.sha256(_piece(tokens)).hexdigest()


def prefix_digests(tokens: Sequence[int | str], lengths: Iterable[int]) -> dict[int, str]:
    """The digest of `tokens[:n]` for each n in `lengths` (at most len(tokens)), the tokens hashed once in all."""
    h = hashlib.sha256()
    out: dict[int, str] = {}
    at = 0
    for n in sorted(set(lengths)):
        if n > len(tokens):
            break
        h.update(_piece(tokens[at:n]))
        at = n
        out[n] = h.copy().hexdigest()
    return out
