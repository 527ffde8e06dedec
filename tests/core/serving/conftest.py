"""One engine for the serving tests; each test loads the tiny model it needs (a load takes milliseconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from macapp.core.engine import Engine

TIMEOUT = 120


@pytest.fixture(scope="package")
def engine():
    e = Engine()
    yield e
    e.close()


@pytest.fixture
def load(engine):
    """load(path) -> the engine with that model loaded (skipped when it already is)."""

    def _load(path) -> Engine:
        if engine.loaded is None or engine.loaded.path != str(Path(path).resolve()):
            engine.load(str(path)).result(timeout=TIMEOUT)
        return engine

    return _load
