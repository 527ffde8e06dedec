"""Where the app keeps its data, settings, logs and built-in resources."""

from __future__ import annotations

import os
import sys
from importlib import resources
from pathlib import Path

import platformdirs

from macapp import APP_NAME

HOME_ENV = "QWEN_DESK_HOME"


def app_home() -> Path:
    """The app's data folder: $QWEN_DESK_HOME, else ~/Library/Application Support/Qwen Desk (macOS) or the XDG data folder."""
    override = os.environ.get(HOME_ENV)
    home = Path(override).expanduser() if override else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    home.mkdir(parents=True, exist_ok=True)
    return home


def db_path() -> Path:
    return app_home() / "history.sqlite3"


def settings_path() -> Path:
    return app_home() / "settings.json"


def logs_dir() -> Path:
    path = app_home() / "logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    """App-level cache (e.g. catalog rows refreshed from the hub); model weights live in the HF cache, not here."""
    path = app_home() / "cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def pictures_dir() -> Path:
    """Pictures sent in chats, one file per picture named by its content's SHA-256 (the history refers to them)."""
    path = app_home() / "pictures"
    path.mkdir(parents=True, exist_ok=True)
    return path


def resources_dir() -> Path:
    """The built-in data (catalog, icon, style sheet, Info.plist): the bundle's copy, the wheel's, or the checkout's.

    The repository keeps them in its top-level resources/ folder; setup.py installs that folder as the package data
    macapp/resources, read through importlib.resources so a wheel install finds the files beside the code. A source
    checkout (or an editable install, whose macapp/ is the checkout's) has no macapp/resources: the folder beside it.
    """
    frozen_root = getattr(sys, "_MEIPASS", None)
    if frozen_root:
        return Path(frozen_root) / "resources"
    installed = Path(str(resources.files("macapp") / "resources"))
    if installed.is_dir():
        return installed
    return Path(__file__).resolve().parents[2] / "resources"
