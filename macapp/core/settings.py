"""Persisted user preferences: a small JSON file under the app home (Qt-free, shared by the window and the CLI)."""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Mapping

from macapp.core.jsonvalue import JSONObject, JSONValue
from macapp.core.paths import settings_path


class Settings:
    """Dotted-key preferences backed by one JSON file; every `set` is written atomically."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path else settings_path()
        self._lock = threading.Lock()
        self._data: JSONObject = self._read()

    def _read(self) -> JSONObject:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str, default: JSONValue = None) -> JSONValue:
        with self._lock:
            return self._data.get(key, default)

    def set(self, key: str, value: JSONValue) -> None:
        with self._lock:
            if self._data.get(key) == value:
                return
            self._data[key] = value
            self._write()

    def update(self, values: Mapping[str, JSONValue]) -> None:
        with self._lock:
            self._data.update(values)
            self._write()

    def remove(self, key: str) -> None:
        with self._lock:
            if self._data.pop(key, None) is not None:
                self._write()

    def _write(self) -> None:
        # Write-then-rename so a crash mid-write never leaves a half-written settings file.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".settings-", suffix=".json", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(self._data, fh, indent=2, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
