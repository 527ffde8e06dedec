"""Keeping the local server's API key between runs, when the user asks ("Remember key" in the window).

On macOS it goes into the login keychain through the `security` tool (service "qwen-desk", account "local-api");
elsewhere, and wherever the keychain cannot be used (locked, no session, the tool missing), into a file in the
app's settings folder that only this user can read (0600, written atomically). One copy at a time: a key saved
to the keychain removes the file's. The key itself is never logged, and never put on a command line (other users
see those in `ps`): `security -i` reads the command from stdin.

The tool's answers are read by small functions (`found_key`, `wrote`, `deleted`) tested with recorded outputs;
`run_security` is the real call.
"""

from __future__ import annotations

import enum
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from macapp.core.paths import app_home

log = logging.getLogger(__name__)

SERVICE = "qwen-desk"
ACCOUNT = "local-api"
KEY_FILE_NAME = "server-api-key"
SECURITY_TOOL = "/usr/bin/security"
# `security` exits with the low byte of the OSStatus: errSecItemNotFound (-25300) is 44.
ITEM_NOT_FOUND = 44
MAX_KEY_CHARS = 1024  # `security -i` reads lines of at most 4096 bytes; a key is a header value, far shorter


class KeyRejected(ValueError):
    """A key that cannot be kept as given: clients send it in a header, so printable ASCII, and `security -w`
    prints anything else as hex."""


def check_key(key: str) -> str:
    if not key or len(key) > MAX_KEY_CHARS or not all(32 <= ord(c) < 127 for c in key):
        raise KeyRejected("An API key to remember must be 1 to 1024 printable ASCII characters (no line breaks).")
    return key


@dataclass(frozen=True)
class CommandResult:
    code: int
    stdout: str = ""
    stderr: str = ""


SecurityRunner = Callable[[list[str], "str | None"], CommandResult]


def run_security(args: list[str], stdin: str | None = None) -> CommandResult:
    """Run /usr/bin/security; -1 when it cannot run at all."""
    try:
        done = subprocess.run([SECURITY_TOOL, *args], input=stdin, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError) as exc:
        return CommandResult(-1, "", f"{type(exc).__name__}")
    return CommandResult(done.returncode, done.stdout, done.stderr)


class Outcome(enum.Enum):
    DONE = "done"
    MISSING = "missing"  # no such item
    UNAVAILABLE = "unavailable"  # the keychain could not be used: fall back to the file


def quoted(value: str) -> str:
    """`value` as one argument of `security -i`'s line parser (double quotes, backslash escapes)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def add_line(key: str) -> str:
    return f"add-generic-password -U -s {quoted(SERVICE)} -a {quoted(ACCOUNT)} -w {quoted(check_key(key))}\n"


FIND_ARGS = ["find-generic-password", "-s", SERVICE, "-a", ACCOUNT, "-w"]
DELETE_ARGS = ["delete-generic-password", "-s", SERVICE, "-a", ACCOUNT]


def found_key(result: CommandResult) -> tuple[Outcome, str | None]:
    """What `security find-generic-password … -w` said: the key (stdout, one line), none stored, or no keychain."""
    if result.code == 0:
        key = result.stdout.rstrip("\n")
        return (Outcome.DONE, key) if key else (Outcome.MISSING, None)
    if result.code == ITEM_NOT_FOUND:
        return Outcome.MISSING, None
    return Outcome.UNAVAILABLE, None


def wrote(result: CommandResult) -> Outcome:
    """What `security -i` said after the add line: it exits with that command's status, and without -q it
    reports a failing command on stderr ("add-generic-password: returned N")."""
    if result.code == 0 and "returned" not in result.stderr:
        return Outcome.DONE
    return Outcome.UNAVAILABLE


def deleted(result: CommandResult) -> Outcome:
    if result.code == 0:
        return Outcome.DONE
    return Outcome.MISSING if result.code == ITEM_NOT_FOUND else Outcome.UNAVAILABLE


@dataclass
class Keychain:
    run: SecurityRunner = run_security

    @staticmethod
    def usable() -> bool:
        return sys.platform == "darwin" and shutil.which(SECURITY_TOOL) is not None

    def load(self) -> tuple[Outcome, str | None]:
        return found_key(self.run(FIND_ARGS, None))

    def save(self, key: str) -> Outcome:
        return wrote(self.run(["-i"], add_line(key)))

    def delete(self) -> Outcome:
        return deleted(self.run(DELETE_ARGS, None))


@dataclass
class KeyFile:
    path: Path

    def load(self) -> str | None:
        try:
            if self.path.stat().st_mode & 0o077:  # someone widened it: narrow it before reading
                os.chmod(self.path, 0o600)
            key = self.path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        return key or None

    def save(self, key: str) -> None:
        """Atomically: a 0600 temporary file beside it (mkstemp's mode), synced, then renamed over it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(check_key(key))
                out.flush()
                os.fsync(out.fileno())
            os.chmod(temp, 0o600)
            os.replace(temp, self.path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)


class Place(enum.Enum):
    KEYCHAIN = "the keychain"
    FILE = "a file only you can read"


@dataclass
class KeyStore:
    """The remembered key: the keychain when there is one, else (and as the fallback) the file."""

    file: KeyFile
    keychain: Keychain | None = field(default=None)

    @classmethod
    def default(cls) -> "KeyStore":
        return cls(KeyFile(app_home() / KEY_FILE_NAME), Keychain() if Keychain.usable() else None)

    def load(self) -> str | None:
        if self.keychain is not None:
            outcome, key = self.keychain.load()
            if outcome is Outcome.DONE:
                return key
            if outcome is Outcome.UNAVAILABLE:
                log.warning("the keychain could not be read; looking for the server key in the settings folder")
        return self.file.load()

    def save(self, key: str) -> Place:
        check_key(key)
        if self.keychain is not None:
            if self.keychain.save(key) is Outcome.DONE:
                self.file.delete()
                return Place.KEYCHAIN
            log.warning("the keychain could not be written; keeping the server key in the settings folder instead")
        self.file.save(key)
        return Place.FILE

    def forget(self) -> None:
        if self.keychain is not None and self.keychain.delete() is Outcome.UNAVAILABLE:
            log.warning("the keychain could not be changed; a server key kept there may remain")
        self.file.delete()
