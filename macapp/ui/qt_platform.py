"""Before Qt opens a window on Linux/X11: say there is no display, or name the missing xcb libraries and the apt command.

Without a display or those libraries Qt aborts the whole process (SIGABRT) with "could not load the Qt platform
plugin "xcb"" and a list of platforms, which tells a new user nothing (its message even blames xcb-cursor when
another library is the gap, or none is). So the window front end checks `DISPLAY` and asks `ldd` about the plugin
first, and prints the fix instead. A `--screenshot` with no display needs no screen: it picks Qt's offscreen
platform itself.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found\s*$", re.MULTILINE)
# Debian names a library package after its soname (libxcb-icccm.so.4 -> libxcb-icccm4); the exceptions:
PACKAGE_EXCEPTIONS = {
    "libX11-xcb.so.1": "libx11-xcb1",
    "libglib-2.0.so.0": "libglib2.0-0",
    "libEGL.so.1": "libegl1",
    "libGL.so.1": "libgl1",
    "libOpenGL.so.0": "libopengl0",
}


def missing_libraries(ldd_output: str) -> list[str]:
    """The sonames `ldd` could not find, in order, once each."""
    return list(dict.fromkeys(NOT_FOUND.findall(ldd_output or "")))


def debian_package(soname: str) -> str:
    """The Debian/Ubuntu package that ships `soname` (by Debian's naming rule)."""
    if soname in PACKAGE_EXCEPTIONS:
        return PACKAGE_EXCEPTIONS[soname]
    match = re.match(r"^(lib[\w+.-]*?)\.so\.(\d+)", soname)
    if not match:
        return soname
    name, version = match.groups()
    return f"{name.lower()}{'-' if name[-1].isdigit() else ''}{version}"


def missing_message(missing: list[str]) -> str | None:
    """What to tell the user when Qt's xcb plugin cannot load, or None when nothing is missing."""
    if not missing:
        return None
    packages = " ".join(dict.fromkeys(debian_package(name) for name in missing))
    return (
        f"Qt cannot open a window: its X11 (xcb) platform plugin needs {', '.join(missing)}, which this system lacks.\n"
        f"Install them (Debian/Ubuntu):  sudo apt-get install {packages}\n"
        "Qt's xcb plugin needs: libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-image0 libxcb-render-util0 "
        "libxcb-xkb1 libxkbcommon-x11-0 libxcb-randr0 libxcb-shape0.\n"
        "(Or run without a window: qwen-desk --help lists the command-line tools.)"
    )


NO_DISPLAY_MESSAGE = (
    "Qt cannot open a window: there is no display (DISPLAY and WAYLAND_DISPLAY are not set; an ssh session or a "
    "server without a desktop).\n"
    "Run it from a desktop session, or over ssh with X forwarding (ssh -X).\n"
    "Without a display: qwen-desk --screenshot window.png renders the window to a PNG (Qt's offscreen platform, "
    "chosen by itself; QT_QPA_PLATFORM=offscreen does the same), and qwen-desk --help lists the command-line tools."
)


def will_use_xcb(environ: dict[str, str] | os._Environ[str], platform: str = sys.platform) -> bool:
    """Whether Qt will try its xcb plugin: on Linux, asked for explicitly, or by default on an X11 session."""
    if not platform.startswith("linux"):
        return False
    requested = environ.get("QT_QPA_PLATFORM", "")
    if requested:
        return requested.split(";")[0].split(":")[0] == "xcb"
    return not environ.get("WAYLAND_DISPLAY")


def xcb_plugin() -> Path | None:
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    plugin = Path(list(spec.submodule_search_locations)[0]) / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    return plugin if plugin.is_file() else None


def find_missing_xcb_libraries() -> list[str]:
    """Ask `ldd` what the installed xcb plugin cannot find ([] when unknown: then Qt has its say)."""
    plugin, ldd = xcb_plugin(), shutil.which("ldd")
    if plugin is None or ldd is None:
        return []
    try:
        result = subprocess.run([ldd, str(plugin)], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    return missing_libraries(result.stdout)


def has_no_display(environ: dict[str, str] | os._Environ[str], platform: str = sys.platform) -> bool:
    """Linux with neither an X11 nor a Wayland display to talk to (a platform named by hand is the user's call)."""
    if not platform.startswith("linux"):
        return False
    requested = environ.get("QT_QPA_PLATFORM", "")
    if requested:  # xcb named by hand: it needs DISPLAY unless the platform string names the display
        return will_use_xcb(environ, platform) and not environ.get("DISPLAY") and "display=" not in requested
    return not environ.get("DISPLAY") and not environ.get("WAYLAND_DISPLAY")


def choose_screenshot_platform(environ: dict[str, str] | os._Environ[str] = os.environ, platform: str = sys.platform) -> bool:
    """For `--screenshot` without a display and no platform named: use Qt's offscreen one. True when it did."""
    if environ.get("QT_QPA_PLATFORM") or not has_no_display(environ, platform):
        return False
    environ["QT_QPA_PLATFORM"] = "offscreen"
    return True


def platform_problem(environ: dict[str, str] | os._Environ[str] = os.environ, platform: str = sys.platform) -> str | None:
    """The message to print instead of letting Qt abort, or None when the window can open."""
    if not will_use_xcb(environ, platform):
        return None
    if has_no_display(environ, platform):
        return NO_DISPLAY_MESSAGE
    return missing_message(find_missing_xcb_libraries())
