"""The log file a user attaches to a bug report."""

from __future__ import annotations

import logging
import logging.handlers
import sys

import pytest

from macapp.core import logs, paths


def _file_handlers(path):
    return [h for h in logging.getLogger().handlers if isinstance(h, logging.handlers.RotatingFileHandler) and h.baseFilename == str(path)]


def test_log_file_lives_in_the_app_home_and_rotates(_isolated_home):
    path = logs.setup_logging()
    assert path == paths.logs_dir() / "qwen-desk.log"
    assert path.is_relative_to(_isolated_home)
    (handler,) = _file_handlers(path)
    assert handler.maxBytes > 0 and handler.backupCount >= 1

    logging.getLogger("macapp.test").warning("something a user should report")
    handler.flush()
    text = path.read_text()
    assert "starting: Python" in text  # the header says which version and platform wrote the log
    assert "WARNING" in text and "something a user should report" in text


def test_setting_up_twice_adds_no_second_handler():
    first = logs.setup_logging()
    second = logs.setup_logging()
    assert first == second
    assert len(_file_handlers(first)) == 1


def test_log_follows_a_new_app_home(monkeypatch, tmp_path):
    first = logs.setup_logging()
    monkeypatch.setenv("QWEN_DESK_HOME", str(tmp_path / "other"))
    second = logs.setup_logging()
    assert second == tmp_path / "other" / "logs" / "qwen-desk.log"
    assert not _file_handlers(first) and len(_file_handlers(second)) == 1


@pytest.mark.qt_no_exception_capture  # pytest-qt's own excepthook would report the test's deliberate crash
def test_uncaught_exceptions_are_written_to_the_log(capsys):
    path = logs.setup_logging()
    try:
        raise RuntimeError("crash for the bug report")
    except RuntimeError:
        sys.excepthook(*sys.exc_info())
    for handler in _file_handlers(path):
        handler.flush()
    text = path.read_text()
    assert "Uncaught exception" in text and "RuntimeError: crash for the bug report" in text
    assert "crash for the bug report" in capsys.readouterr().err  # the usual traceback still prints


def test_log_level_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(logs.LEVEL_ENV, "debug")
    logs.setup_logging()
    assert logging.getLogger().level == logging.DEBUG
    monkeypatch.setenv(logs.LEVEL_ENV, "nonsense")
    assert logs._resolve_level(None) == logging.INFO
