"""The remembered server key (macapp/core/secrets.py): the `security` tool's answers read from recorded outputs,
the file with real files (mode 0600, atomic replace), the keychain-or-file choice, and the key never logged."""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
from pathlib import Path

import pytest

from macapp.core.secrets import (
    ACCOUNT,
    SERVICE,
    CommandResult,
    KeyFile,
    Keychain,
    KeyRejected,
    KeyStore,
    Outcome,
    Place,
    add_line,
    check_key,
    deleted,
    found_key,
    wrote,
)

RECORDED = json.loads((Path(__file__).parent / "recorded" / "security_keychain.json").read_text())


def answer(name: str) -> CommandResult:
    return CommandResult(**RECORDED[name])


def test_the_find_answers():
    assert found_key(answer("find_found")) == (Outcome.DONE, "s3cret-key")
    assert found_key(answer("find_missing")) == (Outcome.MISSING, None)
    assert found_key(answer("find_locked")) == (Outcome.UNAVAILABLE, None)
    assert found_key(answer("not_runnable")) == (Outcome.UNAVAILABLE, None)


def test_the_add_and_delete_answers():
    assert wrote(answer("add_done")) is Outcome.DONE
    assert wrote(answer("add_denied")) is Outcome.UNAVAILABLE
    assert wrote(CommandResult(0, "", "add-generic-password: returned -25308\n")) is Outcome.UNAVAILABLE
    assert deleted(answer("delete_done")) is Outcome.DONE
    assert deleted(answer("delete_missing")) is Outcome.MISSING
    assert deleted(answer("find_locked")) is Outcome.UNAVAILABLE


def split_line(line: str) -> list[str]:
    """`security -i`'s argument splitting (SecurityTool/security.c split_line): whitespace separates, '"' or "'"
    quote, a backslash takes the next character as it is."""
    args: list[str] = []
    current: list[str] | None = None
    quote = None
    escaped = False
    for ch in line:
        if escaped:
            current.append(ch)
            escaped = False
        elif current is None:
            if ch.isspace():
                continue
            current = []
            if ch in "\"'":
                quote = ch
            elif ch == "\\":
                escaped = True
            else:
                current.append(ch)
        elif ch == "\\":
            escaped = True
        elif (quote and ch == quote) or (not quote and ch.isspace()):
            args.append("".join(current))
            current, quote = None, None
        else:
            current.append(ch)
    if current is not None:
        args.append("".join(current))
    return args


@pytest.mark.parametrize("key", ["plain", 'with "quotes" and \\ backslashes', "  spaces around  ", "it's-$HOME-`x`"])
def test_the_add_line_gives_security_the_key_as_one_argument(key):
    line = add_line(key)
    assert line.endswith("\n") and line.count("\n") == 1
    assert split_line(line) == ["add-generic-password", "-U", "-s", SERVICE, "-a", ACCOUNT, "-w", key]


@pytest.mark.parametrize("key", ["", "two\nlines", "tab\there", "x" * 1025, "clé"])
def test_keys_that_cannot_be_kept_are_refused(key, tmp_path):
    with pytest.raises(KeyRejected):
        check_key(key)
    with pytest.raises(KeyRejected):
        KeyStore(KeyFile(tmp_path / "key")).save(key)
    assert not (tmp_path / "key").exists() and list(tmp_path.iterdir()) == []  # no temporary file left either


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_file_is_user_only_and_replaced_atomically(tmp_path):
    path = tmp_path / "settings" / "server-api-key"
    keys = KeyFile(path)
    assert keys.load() is None
    keys.save("first-key")
    assert mode(path) == 0o600 and path.read_text() == "first-key"
    inode = path.stat().st_ino
    keys.save("second-key")
    assert path.read_text() == "second-key" and mode(path) == 0o600
    assert path.stat().st_ino != inode  # a new file renamed over the old one, never rewritten in place
    assert [p.name for p in path.parent.iterdir()] == ["server-api-key"]  # no temporary left beside it
    os.chmod(path, 0o644)
    assert keys.load() == "second-key" and mode(path) == 0o600  # narrowed again when read
    keys.delete()
    keys.delete()  # twice is fine
    assert not path.exists() and keys.load() is None


def test_a_failed_write_keeps_the_old_key(tmp_path):
    path = tmp_path / "server-api-key"
    keys = KeyFile(path)
    keys.save("kept")
    with pytest.raises(KeyRejected):  # fails after the temporary file was made
        keys.save("bad\nkey")
    assert keys.load() == "kept" and [p.name for p in tmp_path.iterdir()] == ["server-api-key"]


class RecordedSecurity:
    """Answers each `security` call with the next recorded output, and notes what it was asked."""

    def __init__(self, *names: str):
        self.answers = [answer(n) for n in names]
        self.calls: list[tuple[list[str], str | None]] = []

    def __call__(self, args: list[str], stdin: str | None) -> CommandResult:
        self.calls.append((args, stdin))
        return self.answers.pop(0)


def test_the_keychain_is_used_first_and_the_file_copy_removed(tmp_path):
    file = KeyFile(tmp_path / "server-api-key")
    file.save("older-file-key")
    security = RecordedSecurity("add_done", "find_found")
    store = KeyStore(file, Keychain(security))
    assert store.save("s3cret-key") is Place.KEYCHAIN
    assert not file.path.exists()  # one copy only
    ((args, stdin),) = security.calls
    assert args == ["-i"] and "s3cret-key" in stdin  # the key goes in on stdin, never on the command line
    assert store.load() == "s3cret-key"
    assert security.calls[-1] == (["find-generic-password", "-s", SERVICE, "-a", ACCOUNT, "-w"], None)


def test_an_unusable_keychain_falls_back_to_the_file(tmp_path, caplog):
    file = KeyFile(tmp_path / "server-api-key")
    store = KeyStore(file, Keychain(RecordedSecurity("add_denied", "find_locked", "find_missing", "delete_missing")))
    with caplog.at_level(logging.DEBUG):
        assert store.save("s3cret-key") is Place.FILE
        assert mode(file.path) == 0o600
        assert store.load() == "s3cret-key"  # the keychain is locked: the file answers
        assert store.load() == "s3cret-key"  # nothing in the keychain: the file answers
        store.forget()
    assert not file.path.exists() and "keychain" in caplog.text
    assert "s3cret-key" not in caplog.text  # never logged


def test_off_macos_the_file_is_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv("QWEN_DESK_HOME", str(tmp_path))
    store = KeyStore.default()
    if sys.platform != "darwin":
        assert store.keychain is None
    assert store.file.path == tmp_path / "server-api-key"
    if store.keychain is None:
        assert store.save("abc") is Place.FILE and store.load() == "abc"
        store.forget()
        assert store.load() is None
