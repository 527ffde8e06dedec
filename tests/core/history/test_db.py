"""The SQL layer on real files: transactions, a busy file, damaged files set aside with their companions."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from macapp.core.history import ReadOnlyStoreError, Store, StoreError
from macapp.core.history.db import Database, open_or_set_aside, set_aside


def _open(path: Path, **kw) -> Database:
    def migrate(conn: sqlite3.Connection, version: int) -> None:
        if version < 1:
            conn.execute("CREATE TABLE t (x INTEGER)")
            conn.execute("PRAGMA user_version = 1")

    return Database.open(path, known_version=1, migrate=migrate, **kw)


def test_a_write_is_all_or_nothing(tmp_path):
    db = _open(tmp_path / "t.sqlite3")
    with db.write() as conn:
        conn.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(ZeroDivisionError):
        with db.write() as conn:
            conn.execute("INSERT INTO t VALUES (2)")
            1 / 0
    assert [r[0] for r in db.query("SELECT x FROM t")] == [1]
    assert db.user_version == 1 and db.found_version == 0 and not db.read_only
    db.close()


def test_a_newer_file_is_opened_read_only_and_refuses_writes(tmp_path):
    path = tmp_path / "t.sqlite3"
    _open(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 5")
    conn.commit()
    conn.close()
    db = _open(path, label="notebook")
    assert db.read_only and db.found_version == 5
    with pytest.raises(ReadOnlyStoreError, match="notebook is open read-only"):
        with db.write():
            pass
    db.read_only_reason = "Update the app."
    with pytest.raises(ReadOnlyStoreError, match="Update the app"):
        with db.write():
            pass
    db.close()


def test_set_aside_never_overwrites_an_earlier_one(tmp_path):
    first = tmp_path / "h.sqlite3"
    names = []
    for n in range(3):
        first.write_bytes(f"damaged {n}".encode())
        names.append(set_aside(first))
    assert len(set(names)) == 3 and not first.exists()
    assert sorted(p.read_bytes() for p in names) == [b"damaged 0", b"damaged 1", b"damaged 2"]


def test_errors_that_are_not_damage_leave_the_file_alone(tmp_path):
    path = tmp_path / "h.sqlite3"
    path.write_bytes(b"keep me")

    def fail(p: Path):
        raise sqlite3.OperationalError("database is locked")

    with pytest.raises(sqlite3.OperationalError):
        open_or_set_aside(path, fail)
    assert path.read_bytes() == b"keep me" and list(tmp_path.glob("*.corrupt-*")) == []


def _assert_set_aside(store: Store, path: Path, original: bytes) -> None:
    assert store.set_aside is not None and store.set_aside.exists()
    assert store.set_aside.name.startswith("history.sqlite3.corrupt-")
    assert store.set_aside.read_bytes() == original  # nothing deleted or rewritten
    assert str(store.set_aside) in store.notice and "new, empty history" in store.notice
    assert not store.read_only and store.list_conversations() == []
    conv = store.create_conversation("m")  # the fresh database works
    store.add_message(conv.id, "user", "fresh start")
    assert store.search("fresh")[0].conversation_id == conv.id


def test_not_a_database_is_set_aside_with_its_wal(tmp_path):
    path = tmp_path / "history.sqlite3"
    garbage = b"this is not a database, it is a shopping list\n" * 200
    path.write_bytes(garbage)
    (tmp_path / "history.sqlite3-wal").write_bytes(b"stale wal")
    with Store.open(path) as s:
        _assert_set_aside(s, path, garbage)
        assert Path(str(s.set_aside) + "-wal").read_bytes() == b"stale wal"
        assert "not a database" in s.notice


def test_malformed_database_is_set_aside(tmp_path):
    path = tmp_path / "history.sqlite3"
    with Store.open(path) as s:
        for n in range(20):
            conv = s.create_conversation("m")
            for k in range(10):
                s.add_message(conv.id, "user", f"message {n}.{k} " + "lorem ipsum " * 40)
        root = s.database.query("SELECT rootpage FROM sqlite_master WHERE name = 'messages'")[0][0]
        page_size = s.database.query("PRAGMA page_size")[0][0]
    with open(path, "r+b") as fh:  # scribble over the messages table's root page
        fh.seek((root - 1) * page_size)
        fh.write(b"\xff" * page_size)
    damaged = path.read_bytes()
    with Store.open(path) as s:
        _assert_set_aside(s, path, damaged)
        assert "integrity check" in s.notice and "\n" not in s.notice
    aside = [p.name.replace(s.set_aside.name, "") for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    assert sorted(aside) in (["", "-shm"], ["", "-shm", "-wal"])  # the file and its companions, moved together


def test_a_busy_database_is_not_mistaken_for_damage(tmp_path):
    path = tmp_path / "history.sqlite3"
    with Store.open(path) as s:
        conv = s.create_conversation("m")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process mid-write
    try:
        with Store.open(path, busy_timeout_s=0.2) as s:
            assert s.notice is None and [c.id for c in s.list_conversations()] == [conv.id]
            with pytest.raises(StoreError, match="busy"):
                s.rename(conv.id, "x")
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert list(tmp_path.glob("*.corrupt-*")) == []
