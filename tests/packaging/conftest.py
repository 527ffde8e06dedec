"""Fixtures for the packaging tests: packaging/build.py loaded by path (not as a `packaging` package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_build_module():
    spec = importlib.util.spec_from_file_location("qwen_desk_build", ROOT / "packaging" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def build():
    return load_build_module()


@pytest.fixture(autouse=True)
def _restore_logging(monkeypatch):
    """setup_logging() changes process-wide state (root handler and level, excepthooks): undo it after each test."""
    import logging
    import sys
    import threading

    from macapp.core import logs

    root = logging.getLogger()
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    yield
    if logs._handler is not None:
        root.removeHandler(logs._handler)
        logs._handler.close()
        logs._handler = None
