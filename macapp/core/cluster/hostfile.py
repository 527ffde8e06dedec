"""MLX's hostfile: which Macs take part, how to reach them, over which addresses.

The format is MLX's own (what `mlx.distributed_config` writes and `mlx.launch --hostfile` reads): a JSON list
of hosts, `[{"ssh": "mac-studio.local", "ips": ["192.168.1.10"]}, ...]`, or an object
`{"backend": ..., "envs": [...], "hosts": [...]}`; JACCL hosts also list their RDMA devices (`"rdma"`).
Hosts named `127.0.0.1` run on this machine; the others are started over ssh. The first host is rank 0.
Every problem is a HostfileError naming the file and the entry, before anything is started.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

BACKENDS = ("ring", "jaccl")
LOCAL = "127.0.0.1"


class HostfileError(ValueError):
    """A hostfile that cannot be used, with what to fix."""


@dataclass(frozen=True)
class Host:
    ssh: str
    ips: tuple[str, ...]
    rdma: tuple[str | None, ...] = ()

    @property
    def is_local(self) -> bool:
        return self.ssh == LOCAL


@dataclass(frozen=True)
class Hostfile:
    path: Path
    hosts: tuple[Host, ...]
    backend: str = ""  # the file's own choice, if it names one
    envs: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return len(self.hosts)

    def check_backend(self, backend: str) -> None:
        """What `mlx.launch` would refuse for this backend, said up front."""
        if backend not in BACKENDS:
            raise HostfileError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
        where = f"{self.path}"
        if backend == "ring":
            for i, host in enumerate(self.hosts):
                if not host.ips:
                    raise HostfileError(f'{where}: host {i} ({host.ssh}) has no "ips": the ring backend needs an IP address per host')
        else:
            if not self.hosts[0].ips:
                raise HostfileError(f"{where}: host 0 ({self.hosts[0].ssh}) needs an IP address the other hosts can reach (JACCL's coordinator)")
            n = self.size
            for i, host in enumerate(self.hosts):
                if len(host.rdma) != n or host.rdma[i] is not None:
                    raise HostfileError(
                        f'{where}: host {i} ({host.ssh}) needs "rdma": a list of {n} RDMA devices, null for itself '
                        "(write it with `mlx.distributed_config --backend jaccl --over thunderbolt`)"
                    )


def _entry(where: str, i: int, item: object) -> Host:
    if not isinstance(item, dict):
        raise HostfileError(f'{where}: host {i} is {type(item).__name__}, not an object like {{"ssh": "mac.local", "ips": ["192.168.1.10"]}}')
    ssh = item.get("ssh")
    if not isinstance(ssh, str) or not ssh.strip():
        raise HostfileError(f'{where}: host {i} has no "ssh" host name')
    ips = item.get("ips", [])
    if not isinstance(ips, list) or not all(isinstance(ip, str) for ip in ips):
        raise HostfileError(f'{where}: host {i} ({ssh}): "ips" must be a list of IP addresses')
    for ip in ips:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise HostfileError(f"{where}: host {i} ({ssh}): {ip!r} is not an IP address") from None
    rdma = item.get("rdma", [])
    if not isinstance(rdma, list) or not all(d is None or isinstance(d, str) for d in rdma):
        raise HostfileError(f'{where}: host {i} ({ssh}): "rdma" must be a list of device names or null')
    return Host(ssh.strip(), tuple(ips), tuple(rdma))


def read_hostfile(path: str | Path) -> Hostfile:
    """Parse and check a hostfile; HostfileError says what is wrong and where."""
    path = Path(path).expanduser()
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise HostfileError(f"no hostfile at {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise HostfileError(f"cannot read the hostfile {path}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HostfileError(f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    backend, envs = "", []
    if isinstance(data, dict):
        backend, envs, data = data.get("backend", ""), data.get("envs", []), data.get("hosts")
        if not isinstance(backend, str) or not isinstance(envs, list) or not all(isinstance(e, str) for e in envs):
            raise HostfileError(f'{path}: "backend" must be a name and "envs" a list of NAME=value strings')
    if not isinstance(data, list):
        raise HostfileError(f'{path} must hold a JSON list of hosts, e.g. [{{"ssh": "mac.local", "ips": ["192.168.1.10"]}}, ...]')
    hosts = tuple(_entry(str(path), i, item) for i, item in enumerate(data))
    if len(hosts) < 2:
        raise HostfileError(f"{path} lists {len(hosts)} host{'' if len(hosts) == 1 else 's'}: several Macs means at least two")
    return Hostfile(path, hosts, backend, tuple(envs))
