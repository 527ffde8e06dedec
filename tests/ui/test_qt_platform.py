"""The hint printed instead of Qt's abort when the xcb platform plugin's libraries are missing."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

from macapp.ui import qt_platform

RECORDED = Path(__file__).parent / "recorded" / "ldd-libqxcb-debian12.txt"
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only: the xcb plugin and ldd")


def test_the_missing_libraries_are_read_from_ldd():
    assert qt_platform.missing_libraries(RECORDED.read_text()) == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]
    assert qt_platform.missing_libraries("\tlibxcb.so.1 => /lib/x86_64-linux-gnu/libxcb.so.1\n") == []
    assert qt_platform.missing_libraries("") == []


@pytest.mark.parametrize(
    "soname, package",
    [
        ("libxcb-cursor.so.0", "libxcb-cursor0"),
        ("libxcb-icccm.so.4", "libxcb-icccm4"),
        ("libxcb-keysyms.so.1", "libxcb-keysyms1"),
        ("libxcb-render-util.so.0", "libxcb-render-util0"),
        ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"),
        ("libdbus-1.so.3", "libdbus-1-3"),
        ("libX11-xcb.so.1", "libx11-xcb1"),
        ("libEGL.so.1", "libegl1"),
        ("libfontconfig.so.1", "libfontconfig1"),
    ],
)
def test_each_library_maps_to_its_debian_package(soname, package):
    assert qt_platform.debian_package(soname) == package


def test_the_message_gives_the_apt_command_for_what_is_missing():
    message = qt_platform.missing_message(["libxcb-icccm.so.4", "libxcb-keysyms.so.1"])
    assert "sudo apt-get install libxcb-icccm4 libxcb-keysyms1\n" in message
    assert "libxcb-cursor0" in message  # the whole list, as README names it
    assert qt_platform.missing_message([]) is None


@pytest.mark.parametrize(
    "environ, platform, expected",
    [
        ({}, "linux", True),  # an X11 session: Qt's default is xcb
        ({"WAYLAND_DISPLAY": "wayland-0"}, "linux", False),
        ({"QT_QPA_PLATFORM": "offscreen"}, "linux", False),
        ({"QT_QPA_PLATFORM": "xcb"}, "linux", True),
        ({"QT_QPA_PLATFORM": "xcb:display=:1", "WAYLAND_DISPLAY": "w"}, "linux", True),
        ({"QT_QPA_PLATFORM": "wayland;xcb"}, "linux", False),
        ({}, "darwin", False),
    ],
)
def test_only_an_xcb_start_is_checked(environ, platform, expected):
    assert qt_platform.will_use_xcb(environ, platform) is expected


@linux_only
def test_what_ldd_reports_missing_really_does_not_load():
    for soname in qt_platform.find_missing_xcb_libraries():
        with pytest.raises(OSError):
            ctypes.CDLL(soname)
    ctypes.CDLL("libxcb.so.1")  # a library ldd found loads (so the check is not blind)
    assert "libxcb.so.1" not in qt_platform.find_missing_xcb_libraries()


@linux_only
def test_the_window_prints_the_fix_instead_of_qts_abort(tmp_path):
    missing = qt_platform.find_missing_xcb_libraries()
    env = dict(os.environ, QT_QPA_PLATFORM="xcb", DISPLAY=":987", QWEN_DESK_HOME=str(tmp_path))
    env.pop("WAYLAND_DISPLAY", None)
    result = subprocess.run([sys.executable, "-m", "macapp"], capture_output=True, text=True, env=env, timeout=120)
    if missing:  # this machine lacks some: our message, not Qt's
        assert result.returncode == 1
        assert "sudo apt-get install " + " ".join(qt_platform.debian_package(m) for m in missing) in result.stderr
        assert "could not load the Qt platform plugin" not in result.stderr
    else:  # everything is there: Qt gets as far as the (absent) display, and our hint stays out of the way
        assert result.returncode != 0
        assert "sudo apt-get install" not in result.stderr


@pytest.mark.parametrize(
    "environ, platform, expected",
    [
        ({}, "linux", True),  # ssh into a server, no desktop
        ({"DISPLAY": ":0"}, "linux", False),
        ({"WAYLAND_DISPLAY": "wayland-0"}, "linux", False),
        ({"QT_QPA_PLATFORM": "xcb"}, "linux", True),
        ({"QT_QPA_PLATFORM": "xcb:display=:1"}, "linux", False),
        ({"QT_QPA_PLATFORM": "offscreen"}, "linux", False),
        ({}, "darwin", False),
    ],
)
def test_no_display_is_told_apart_from_missing_libraries(environ, platform, expected):
    assert qt_platform.has_no_display(environ, platform) is expected
    assert (qt_platform.platform_problem(environ, platform) == qt_platform.NO_DISPLAY_MESSAGE) is expected


def test_a_screenshot_without_a_display_picks_offscreen_itself():
    environ: dict[str, str] = {}
    assert qt_platform.choose_screenshot_platform(environ, "linux")
    assert environ == {"QT_QPA_PLATFORM": "offscreen"}
    for kept in ({"DISPLAY": ":0"}, {"QT_QPA_PLATFORM": "xcb"}, {"WAYLAND_DISPLAY": "w"}):
        assert not qt_platform.choose_screenshot_platform(dict(kept), "linux")
    assert not qt_platform.choose_screenshot_platform({}, "darwin")


def _no_display_env(tmp_path) -> dict[str, str]:
    env = dict(os.environ, QWEN_DESK_HOME=str(tmp_path))
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        env.pop(name, None)
    return env


@linux_only
def test_the_window_without_a_display_says_so_instead_of_aborting(tmp_path):
    result = subprocess.run([sys.executable, "-m", "macapp"], capture_output=True, text=True, env=_no_display_env(tmp_path), timeout=120)
    assert result.returncode == 1, result.stderr
    assert "there is no display" in result.stderr
    assert "--screenshot" in result.stderr
    assert "libxcb-cursor0" not in result.stderr and "could not load the Qt platform plugin" not in result.stderr


@linux_only
def test_a_screenshot_without_a_display_works(tmp_path):
    out = tmp_path / "window.png"
    result = subprocess.run(
        [sys.executable, "-m", "macapp", "--screenshot", str(out)], capture_output=True, text=True, env=_no_display_env(tmp_path), timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert out.stat().st_size > 10_000
