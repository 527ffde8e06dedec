"""One SQLite file shared by threads: connect, check a file before writing to it, set a damaged one aside,
bring its schema up to date, and run transactions. Nothing here knows what the tables hold.

One connection per process, serialised by a lock; other processes may open the same file at the same time
(WAL readers never block the writer; writers wait up to the busy timeout).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar, Union

from macapp.core.history.errors import ReadOnlyStoreError, StoreError

log = logging.getLogger(__name__)

_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26

T = TypeVar("T")
Migrate = Callable[[sqlite3.Connection, int], None]
SQLValue = Union[str, bytes, int, float, None]  # what an SQLite column holds (a parameter or a value read)
Functions = Mapping[str, tuple[int, Callable[..., Any]]]  # SQL name -> (number of arguments, function)


class CorruptDatabase(Exception):
    """The integrity check found damage (files SQLite cannot read at all raise sqlite3.DatabaseError)."""


def is_corruption(exc: sqlite3.DatabaseError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text or "file is encrypted" in text


def connect(path: Path, busy_timeout_s: float, *, read_only: bool = False, functions: Functions | None = None) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), rows by name, foreign keys on."""
    target = f"{path.resolve().as_uri()}?mode=ro" if read_only else str(path)
    conn = sqlite3.connect(target, uri=read_only, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    for name, (n_args, fn) in (functions or {}).items():
        conn.create_function(name, n_args, fn, deterministic=True)
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def user_version(conn: sqlite3.Connection) -> int:
    version: int = conn.execute("PRAGMA user_version").fetchone()[0]
    return version


def read_only_probe(path: Path, busy_timeout_s: float, functions: Functions | None = None) -> sqlite3.Connection | None:
    """A read-only connection to check an existing file before writing to it; None when there is nothing to check.

    Read-only on purpose: closing a read-write connection on a damaged file would checkpoint into it and
    delete its -wal, which may hold the newest rows.
    """
    if not path.exists() or path.stat().st_size == 0:
        return None
    conn = None
    try:
        conn = connect(path, busy_timeout_s, read_only=True, functions=functions)
        conn.execute("PRAGMA schema_version").fetchone()
        return conn
    except sqlite3.OperationalError as exc:
        if conn is not None:
            conn.close()
        if is_corruption(exc):
            raise
        # e.g. a hot rollback journal, which only a read-write connection may recover: open that way unchecked.
        log.info("Read-only check of %s skipped: %s", path, exc)
        return None
    except sqlite3.DatabaseError:
        if conn is not None:
            conn.close()
        raise


def quick_check(conn: sqlite3.Connection) -> None:
    """Raise CorruptDatabase with a one-line summary when SQLite's quick_check finds damage."""
    problems = [row[0] for row in conn.execute("PRAGMA quick_check(5)")]
    if problems != ["ok"]:
        detail = " ".join(" ".join(problems).replace("*** in database main ***", "").split())
        raise CorruptDatabase(f"integrity check: {detail[:160]}")


def set_aside(path: Path) -> Path:
    """Rename a damaged database (and its -wal/-shm) to <name>.corrupt-YYYYmmdd-HHMMSS; returns the new path."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    path.rename(aside)
    for suffix in ("-wal", "-shm", "-journal"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            # Moved along: a stale WAL left beside the fresh database would be replayed into it.
            side.rename(aside.with_name(aside.name + suffix))
    return aside


@dataclass(frozen=True)
class SetAside:
    """A damaged file that was moved out of the way before a fresh one was started."""

    path: Path
    reason: str


def open_or_set_aside(path: Path, open_fn: Callable[[Path], T]) -> tuple[T, SetAside | None]:
    """`open_fn(path)`; if the file turns out damaged, move it aside and open a fresh one in its place.

    Any other sqlite3.DatabaseError (busy, a failed migration ...) propagates and leaves the file untouched.
    """
    try:
        return open_fn(path), None
    except CorruptDatabase as exc:
        reason = str(exc)
    except sqlite3.DatabaseError as exc:
        if not is_corruption(exc):
            raise
        reason = str(exc)
    aside = set_aside(path)
    return open_fn(path), SetAside(aside, reason)


class Database:
    """One connection, its lock and its transactions. Open with `Database.open()`."""

    def __init__(self, conn: sqlite3.Connection, path: Path, *, read_only: bool = False, found_version: int = 0, label: str = "database") -> None:
        self.conn = conn
        self.path = path
        self.read_only = read_only
        self.read_only_reason: str | None = None  # what a refused write says, when read-only
        self.found_version = found_version  # the schema version on disk when opened (before migrating)
        self.label = label
        self.lock = threading.RLock()

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        known_version: int,
        migrate: Migrate,
        busy_timeout_s: float = 5.0,
        functions: Functions | None = None,
        label: str = "database",
    ) -> Database:
        """Check, then open read-write in WAL mode and migrate; a file from a newer schema is opened read-only."""
        probe = read_only_probe(path, busy_timeout_s, functions)
        if probe is not None:
            try:
                version = user_version(probe)
                if version > known_version:
                    newer, probe = cls(probe, path, read_only=True, found_version=version, label=label), None
                    return newer
                quick_check(probe)
            finally:
                if probe is not None:
                    probe.close()
        conn = connect(path, busy_timeout_s, functions=functions)
        try:
            version = user_version(conn)
            if version > known_version:  # a newer app upgraded it meanwhile
                conn.close()
                ro = connect(path, busy_timeout_s, read_only=True, functions=functions)
                return cls(ro, path, read_only=True, found_version=version, label=label)
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                log.warning("SQLite kept journal mode %s for %s", mode, path)
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes, never corrupt
            migrate(conn, version)
            return cls(conn, path, found_version=version, label=label)
        except BaseException:
            conn.close()
            raise

    @property
    def user_version(self) -> int:
        with self.lock:
            return user_version(self.conn)

    def query(self, sql: str, params: Sequence[SQLValue] = ()) -> list[sqlite3.Row]:
        """All rows of one statement (read outside any transaction)."""
        with self.lock:
            return self.conn.execute(sql, params).fetchall()

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE), committed on success and rolled back on any exception."""
        if self.read_only:
            raise ReadOnlyStoreError(self.read_only_reason or f"The {self.label} is open read-only.")
        with self.lock:
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise StoreError(f"The {self.label} is busy ({exc}); another Qwen Desk may be writing to {self.path}. Try again.") from exc
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A consistent snapshot across several SELECTs."""
        with self.lock:
            self.conn.execute("BEGIN")
            try:
                yield self.conn
            finally:
                self.conn.execute("COMMIT")

    def close(self) -> None:
        with self.lock:
            self.conn.close()
