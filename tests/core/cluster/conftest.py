"""Hostfiles for two ranks on this machine, and a model whose heads cannot be cut two ways. Nothing here
reaches past this machine: every ssh and name lookup the launcher makes must be for 127.0.0.0/8."""

import ipaddress
import json
import socket

import pytest

from macapp.core.demo.tiny_model import make_tiny_model

LOCAL = {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}
HANG_S = 60  # a fault must end the run well before this: a bound that tells a hang, not a speed (2 loaded cores)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("@")[-1]) in ipaddress.ip_network("127.0.0.0/8")
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """The launcher's real ssh and name lookups, refused for anything but a loopback address."""
    from macapp.core.cluster import launch

    real_ssh, real_lookup = launch.ssh, socket.getaddrinfo

    def ssh(host, command, timeout=launch.SSH_TIMEOUT_S):
        assert is_loopback(host), f"a test tried to ssh to {host}"
        return real_ssh(host, command, timeout)

    def getaddrinfo(host, *args, **kwargs):
        assert host is None or is_loopback(str(host)) or host == "localhost", f"a test tried to look up {host}"
        return real_lookup(host, *args, **kwargs)

    monkeypatch.setattr(launch, "ssh", ssh)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture(autouse=True)
def no_run_left_behind(monkeypatch):
    """Every ClusterRun a test starts has ended by the test's end; one still going (a test that failed before
    its wait) is ended here, so a failing test leaves no ranks running either."""
    from macapp.core.cluster.launch import ClusterRun

    started, real_start = [], ClusterRun.start

    def start(run):
        started.append(run)
        real_start(run)

    monkeypatch.setattr(ClusterRun, "start", start)
    yield
    going = [run for run in started if run.proc is not None and run.proc.poll() is None]
    for run in going:
        run._end(grace=0)
        run.close()
    assert not going, "a cluster run was still going at the end of the test"


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
