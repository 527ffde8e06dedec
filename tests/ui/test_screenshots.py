"""The newcomer screenshot set (issue #22, long-context mode from #24) is made from the real window, offscreen."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from PIL import Image

SHOTS = ["demo", "library", "offline", "load-prompt", "settings", "port", "undo", "long-context", "long-context-chat"]


@pytest.mark.slow
def test_every_newcomer_state_is_shot_and_shows_something(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run(
        [sys.executable, "-m", "macapp.devtools.screenshots_newcomer", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for name in SHOTS:
        with Image.open(tmp_path / f"newcomer-{name}.png") as shot:
            colours = shot.convert("RGB").getcolors(maxcolors=1 << 16)
            assert shot.width >= 300 and shot.height >= 200, name  # the settings panel is shot alone
            assert colours is None or len(colours) > 8, f"{name} is nearly blank"
