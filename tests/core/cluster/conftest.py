"""Hostfiles for two ranks on this machine, and a model whose heads cannot be cut two ways."""

import json

import pytest

from macapp.devtools.tiny_model import make_tiny_model

LOCAL = {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}


@pytest.fixture
def write_hostfile(tmp_path):
    def write(hosts, name="hosts.json"):
        path = tmp_path / name
        path.write_text(hosts if isinstance(hosts, str) else json.dumps(hosts))
        return path

    return write


@pytest.fixture
def two_local(write_hostfile):
    return write_hostfile([LOCAL, LOCAL])


@pytest.fixture(scope="session")
def tiny_three_heads_path(tiny_models_dir):
    """A dense model with 3 attention heads (hidden 192): tensor parallelism cannot split it two ways."""
    return make_tiny_model(tiny_models_dir / "tiny-qwen3.5-dense-3heads", kind="dense", hidden_size=192)


def drive_command(*items, **options):
    """The scripted chat of tests/core/cluster/drive.py for these models (PATH[:shard][:stop])."""
    import sys

    argv = [sys.executable, "-m", "tests.core.cluster.drive", *map(str, items)]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


def records(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def processes_naming(path) -> list[int]:
    """Processes whose command line names `path` (the launcher passes the hostfile to mlx.launch and every rank)."""
    import os

    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if str(path).encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found
