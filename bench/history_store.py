"""What the chat history costs (run by hand: `python bench/history_store.py`).

- per-token cost of recording a streamed reply (the writer's throttle keeps commits to ~1/s);
- one streaming commit as the reply grows (replies in flight are kept out of the FTS index until they end);
- opening a large history (integrity quick_check + migrations check) and searching it, index vs scan.
"""

from __future__ import annotations

import platform
import sqlite3
import tempfile
import time
from datetime import date
from pathlib import Path

from macapp.core.history import Store, fts5_available
from macapp.core.history.search import Search

WORDS = "the quick brown fox jumps over a lazy dog while sourdough rises slowly in warm kitchens".split()


def text_of(chars: int, seed: int = 0) -> str:
    out, i = [], seed
    while sum(len(w) + 1 for w in out) < chars:
        out.append(WORDS[i % len(WORDS)] + str(i % 97))
        i += 7
    return " ".join(out)[:chars]


def timed(fn, repeat: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    print(f"history store — {platform.machine()} {platform.system()} — SQLite {sqlite3.sqlite_version} — {date.today()}")
    print(f"FTS5 trigram index: {fts5_available()}")

    with Store.open(tmp / "stream.sqlite3") as s:
        conv = s.create_conversation("bench")
        s.add_message(conv.id, "user", "go")
        writer = s.begin_reply(conv.id)
        tokens = 20_000
        per_token = timed(lambda: writer.append("tok "), tokens)
        writer.finish()
        print(f"append() per token, 1 s throttle: {per_token * 1e6:.1f} µs ({writer.commits} commits for {tokens} tokens)")

        for chars in (1_000, 10_000, 50_000, 200_000):
            w = s.begin_reply(conv.id, interval=0)
            body = text_of(chars)
            w.update(body[:-1])
            cost = timed(lambda: (w.update(body), w.update(body[:-1])), 10) / 2
            w.finish()
            print(f"one streaming commit, reply of {chars:>7} chars: {cost * 1e3:6.2f} ms")

    path = tmp / "big.sqlite3"
    n_conv, per_conv = 500, 20
    with Store.open(path) as s:
        start = time.perf_counter()
        for c in range(n_conv):
            conv = s.create_conversation("bench")
            for m in range(per_conv):
                s.add_message(conv.id, "user" if m % 2 == 0 else "assistant", text_of(600, c * per_conv + m))
        fill = time.perf_counter() - start
    size = path.stat().st_size + sum(p.stat().st_size for p in tmp.glob("big.sqlite3-*"))
    print(
        f"filled {n_conv * per_conv} messages in {fill:.1f} s ({fill / (n_conv * per_conv) * 1e3:.2f} ms per committed message); {size / 1e6:.0f} MB with index"
    )
    open_s = timed(lambda: Store.open(path).close(), 3)
    print(f"open (quick_check + schema) of that history: {open_s * 1e3:.0f} ms")
    with Store.open(path) as s:
        scanner = Search(s.database, indexed=False)
        for query in ("sourdough42", "lazy dog", "zebra"):
            indexed = timed(lambda: s.search(query, limit=50), 3)
            scan = timed(lambda: scanner.run(query, limit=50), 3)
            print(f"search {query!r:14}: index {indexed * 1e3:7.1f} ms, scan {scan * 1e3:7.1f} ms, ratio {scan / indexed:5.1f}x")


if __name__ == "__main__":
    main()
