"""The log file a user can attach to a bug report: <app home>/logs/qwen-desk.log, rotated."""

from __future__ import annotations

import logging
import logging.handlers
import os
import platform
import sys
import threading
from pathlib import Path
from types import TracebackType

from macapp import __version__
from macapp.core import paths

LOG_NAME = "qwen-desk.log"
LEVEL_ENV = "QWEN_DESK_LOG_LEVEL"
MAX_BYTES = 2 * 1024 * 1024
BACKUP_COUNT = 3
FORMAT = "%(asctime)s %(levelname)-7s %(threadName)s %(name)s: %(message)s"

_handler: logging.Handler | None = None


def log_path() -> Path:
    return paths.logs_dir() / LOG_NAME


def setup_logging(level: str | int | None = None) -> Path:
    """Send the root logger to the rotating log file (once per process) and return the file's path.

    Uncaught exceptions, in the main thread and in worker threads, go to the log too: a crash in a
    windowed app has no terminal, and the trace is what a bug report needs.
    """
    global _handler
    path = log_path()
    root = logging.getLogger()
    if _handler is not None and Path(getattr(_handler, "baseFilename", "")) == path:
        return path
    if _handler is not None:  # the app home moved (tests, QWEN_DESK_HOME): follow it
        root.removeHandler(_handler)
        _handler.close()

    handler = logging.handlers.RotatingFileHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUP_COUNT, encoding="utf-8", delay=False)
    handler.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(handler)
    root.setLevel(_resolve_level(level))
    _handler = handler
    logging.captureWarnings(True)
    _install_excepthooks()

    logging.getLogger("macapp").info(
        "Qwen Desk %s starting: Python %s on %s (%s), frozen=%s, pid %d",
        __version__,
        platform.python_version(),
        platform.platform(),
        platform.machine(),
        bool(getattr(sys, "frozen", False)),
        os.getpid(),
    )
    return path


def _resolve_level(level: str | int | None) -> int:
    value = level if level is not None else os.environ.get(LEVEL_ENV, "INFO")
    if isinstance(value, int):
        return value
    resolved = logging.getLevelName(str(value).upper())
    return resolved if isinstance(resolved, int) else logging.INFO


def _install_excepthooks() -> None:
    previous_hook = sys.excepthook
    previous_thread_hook = threading.excepthook
    if getattr(previous_hook, "_qwen_desk", False):
        return

    def log_uncaught(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if not issubclass(exc_type, KeyboardInterrupt):
            logging.getLogger("macapp").critical("Uncaught exception", exc_info=(exc_type, exc, tb))
        previous_hook(exc_type, exc, tb)

    def log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
        if not issubclass(args.exc_type, SystemExit):
            # exc_value is None only for an exception type raised without an instance, which Python never hands here
            exc_info = (args.exc_type, args.exc_value, args.exc_traceback) if args.exc_value is not None else True
            logging.getLogger("macapp").critical("Uncaught exception in thread %s", getattr(args.thread, "name", "?"), exc_info=exc_info)
        previous_thread_hook(args)

    log_uncaught._qwen_desk = True  # type: ignore[attr-defined]
    sys.excepthook = log_uncaught
    threading.excepthook = log_uncaught_in_thread
