"""`qwen-desk models | head -2`: a reader that goes away early ends the command quietly, as command-line tools do."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("command", [["models"], ["models", "--json"], ["history", "list", "--json"], ["fit", "Qwen3.5-9B"]])
def test_a_closed_pipe_ends_the_command_without_a_traceback(command, tmp_path):
    env = dict(os.environ, QWEN_DESK_HOME=str(tmp_path), HF_HUB_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-m", "macapp", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # before it writes anything: every write it makes meets a closed pipe
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err and b"BrokenPipeError" not in err and b"Exception ignored" not in err
