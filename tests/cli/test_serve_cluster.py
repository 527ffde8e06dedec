"""`qwen-desk serve --hostfile`: the local API answered by two ranks on this machine; SIGTERM ends every rank."""

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time

import httpx2

from tests.core.cluster.conftest import HANG_S, LOCAL, processes_naming

URL = re.compile(r"at (http://127\.0\.0\.1:\d+) ")


def test_two_ranks_serve_the_api_and_sigterm_ends_them(tiny_dense_path, tmp_path):
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([LOCAL, LOCAL]))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "macapp", "serve", "--model", str(tiny_dense_path), "--port", "0", "--no-think", "--hostfile", str(hostfile)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        url, deadline = None, time.monotonic() + 120
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            if sel.select(0.2):
                match = URL.search(proc.stdout.readline())
                url = match and match.group(1)
        assert url, proc.stderr.read() if proc.poll() is not None else "no ready line"
        for _ in range(2):  # a second request reads its whole prompt again (no checkpoints across Macs)
            reply = httpx2.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "temperature": 0}, timeout=60)
            assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "The answer is here!"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "[2 hosts, tensor split, ring backend" in err and "SIGTERM: stopping" in err
    assert processes_naming(hostfile) == []  # mlx.launch and both ranks are gone

