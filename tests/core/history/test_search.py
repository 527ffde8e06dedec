"""Search: every term, any case, phrases, CJK; the FTS5 index when there is one, a scan otherwise, same answers."""

from __future__ import annotations

import pytest

from macapp.core.history import Store, schema, search_terms
from macapp.core.history.search import Search, snippet


def test_search_substring_case_and_terms(store, sourdough):
    cid = sourdough(store)
    other = store.create_conversation("m")
    store.add_message(other.id, "user", "今天天气怎么样？ Weather in Tokyo")
    store.add_message(other.id, "assistant", "100% sunny_day", reasoning="look up forecast")
    assert store.search_uses_index == schema.fts5_available()

    assert [(h.conversation_id, h.role) for h in store.search("SOURDOUGH")] == [(cid, "user")]
    assert [h.role for h in store.search("flour overnight")] == ["assistant"]  # all terms, any order
    assert store.search("flour tokyo") == []
    assert [h.role for h in store.search('"bake at 250"')] == ["assistant"]  # a phrase
    assert [h.role for h in store.search("recipe")] == ["assistant"]  # reasoning is searched too
    assert [h.conversation_id for h in store.search("天气")] == [other.id]  # two CJK characters: scan
    assert [h.conversation_id for h in store.search("今天天气")] == [other.id]  # four: index
    assert [h.role for h in store.search("100%")] == ["assistant"]
    assert [h.role for h in store.search("sunny_")] == ["assistant"]
    assert store.search("'\"") == [] and store.search("   ") == []
    hit = store.search("overnight")[0]
    assert "overnight" in hit.snippet and hit.conversation_title.startswith("How do I bake")
    store.delete(cid)
    assert store.search("sourdough") == []


@pytest.mark.parametrize(
    "query, terms",
    [("a  b", ["a", "b"]), ('"bake at" 250', ["bake at", "250"]), ('" "  x', ["x"]), ("", [])],
)
def test_search_terms(query, terms):
    assert search_terms(query) == terms


def test_snippet_centres_on_the_term():
    text = "word " * 30 + "needle\n in the\thay " + "word " * 30
    cut = snippet(text, "NEEDLE", width=10)
    assert cut.startswith("…") and cut.endswith("…") and "needle in the" in cut and len(cut) <= 2 + 10 + 6 + 10
    assert snippet("short", "absent") == "short"


def test_index_and_scan_give_the_same_hits(store, sourdough):
    sourdough(store)
    conv = store.create_conversation("m")
    store.add_message(conv.id, "user", "Sourdough starter smells of acetone")
    scan = Search(store.database, indexed=False)
    for query in ("sourdough", "starter", "bake 250", "acetone smells", "zebra"):
        assert [h.message_id for h in scan.run(query)] == [h.message_id for h in store.search(query)], query
    assert len(scan.run("sourdough", limit=1)) == 1


def test_search_without_fts5_falls_back_and_index_is_rebuilt_later(tmp_path, monkeypatch, sourdough):
    path = tmp_path / "history.sqlite3"
    with Store.open(path) as s:
        sourdough(s)
    monkeypatch.setattr(schema, "fts5_available", lambda: False)  # a SQLite built without FTS5
    with Store.open(path) as s:
        assert not s.search_uses_index
        conv = s.create_conversation("m")
        s.add_message(conv.id, "user", "written while the index was off: marmalade")
        assert len(s.search("marmalade")) == 1 and len(s.search("sourdough")) == 1
    monkeypatch.undo()
    if not schema.fts5_available():
        return  # nothing more to check on a SQLite without FTS5
    with Store.open(path) as s:
        assert s.search_uses_index
        assert len(s.search("marmalade")) == 1 and len(s.search("sourdough")) == 1
        s.database.conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")  # raises if stale


def test_replies_in_flight_are_found_and_indexed_once_finished(store):
    conv = store.create_conversation("m")
    store.add_message(conv.id, "user", "q")
    writer = store.begin_reply(conv.id, interval=0)
    writer.append("streaming about pelicans")
    assert [h.message_id for h in store.search("pelicans")] == [writer.message_id]
    if store.search_uses_index:  # not re-indexed on every commit while it streams ...
        count = store.database.query("SELECT COUNT(*) FROM messages_fts WHERE rowid = ?", (writer.message_id,))
        assert count[0][0] == 0
    writer.append(" and puffins")
    writer.finish()
    assert [h.message_id for h in store.search("puffins pelicans")] == [writer.message_id]
    if store.search_uses_index:  # ... but once, when it ends
        count = store.database.query("SELECT COUNT(*) FROM messages_fts WHERE messages_fts MATCH 'puffins'")
        assert count[0][0] == 1
        plan = " ".join(r[3] for r in store.database.query("EXPLAIN QUERY PLAN SELECT id FROM messages WHERE state = 'streaming'"))
        assert "messages_streaming" in plan
