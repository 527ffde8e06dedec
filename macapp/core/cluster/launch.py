"""Start the ranks with `mlx.launch`, after checking everything that can be checked first, and watch them.

Before anything starts (`prepare`): the hostfile parses and suits the backend; the model is here, and the split
asked for is possible (tensor parallelism needs head counts that divide by the number of hosts); every other
host resolves, answers ssh, and holds the same model files (macapp.core.cluster.fingerprint over ssh).

While running (`ClusterRun`): `mlx.launch` and the local ranks run in a process group of their own. Every
rank says on stderr when it has joined the group; a rank that has not joined within `connect_timeout`, or
one that ends before rank 0 is done, ends the run: a clear message, then the whole group is terminated
(SIGTERM, then SIGKILL), so no process is left behind and nothing hangs. mlx.launch's own warnings and the
ring backend's socket noise are turned into that one message.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from macapp.core.catalog import Arch
from macapp.core.cluster.fingerprint import Fingerprint, fingerprint
from macapp.core.cluster.hostfile import Hostfile, read_hostfile
from macapp.core.cluster.rank import DONE, ENV, FOLLOWER_LOST, MODEL_DIFFERS, OTHER_FILES, READY, RankSpec
from macapp.core.cluster.split import Shard, SplitRefused, choose_split
from macapp.core.cluster.watchdog import GAVE_UP
from macapp.core.engine import EngineError, check_model_folder, locate_model

CONNECT_TIMEOUT_S = 60.0
SSH_TIMEOUT_S = 15.0
RESOLVE_TIMEOUT_S = 5.0
GRACE_S = 3.0  # how long mlx.launch gets to wind down by itself after a fault
_READY = re.compile(READY.format(rank=r"(\d+)", size=r"\d+"))
_OTHER_FILES = re.compile(OTHER_FILES.format(rank=r"(\d+)"))
_EXIT = re.compile(r"Node with rank (\d+) (?:exited with code (-?\d+)|was killed)")
_NOISE = re.compile(r"^\[ring\] |^\x1b\[3\dm\[(WARN|INFO)\]")


class ClusterError(Exception):
    """Why the cluster cannot start or had to stop, in one actionable sentence."""


class ShardError(ClusterError):
    """The split asked for is not possible for this model on this many hosts."""


@dataclass(frozen=True)
class Plan:
    hostfile: Hostfile
    backend: str
    shard: Shard
    model_path: Path
    tensor_problems: tuple[str, ...]


def mlx_launch() -> str:
    """The mlx.launch next to this interpreter (the venv's), else the one on PATH."""
    here = Path(sys.executable).with_name("mlx.launch")
    return str(here) if here.exists() else "mlx.launch"


# --- before starting ---


def choose_shard(arch: Arch, hosts: int, bits: int | None, group: int, asked: Shard | None) -> tuple[Shard, tuple[str, ...]]:
    """The split to launch (split.choose_split, no fall-back: a tensor split asked for runs or is refused) and
    why tensor parallelism is impossible; ShardError when the split cannot run."""
    try:
        split = choose_split(arch, hosts, bits, group, asked=asked)
    except SplitRefused as exc:
        raise ShardError(str(exc)) from None
    return split.shard, split.tensor_problems


def prepare(hostfile_path: str | Path, backend: str | None, model_spec: str, shard: Shard | None, check_remote: bool = True) -> Plan:
    """Everything checked before a process starts; ClusterError (or HostfileError, a ValueError) says what is wrong."""
    hostfile = read_hostfile(hostfile_path)
    backend = backend or hostfile.backend or "ring"
    hostfile.check_backend(backend)
    try:
        path = locate_model(model_spec)
        config = check_model_folder(path)
    except EngineError as exc:
        raise ClusterError(exc.message) from None
    arch = Arch.from_config(config)
    quant = config.get("quantization")
    bits, group = (quant.get("bits"), quant.get("group_size")) if isinstance(quant, dict) else (None, None)
    chosen, problems = choose_shard(arch, hostfile.size, bits if isinstance(bits, int) else None, group if isinstance(group, int) and group else 64, shard)
    if chosen is Shard.PIPELINE and not (path / "model.safetensors.index.json").is_file():
        raise ClusterError(f"{path} has no model.safetensors.index.json, which mlx-lm's pipeline split needs: use --shard tensor or a converted model")
    if check_remote:
        check_hosts(hostfile)
        check_model_files(hostfile, model_spec, path)
    return Plan(hostfile, backend, chosen, path, problems)


HOST_NAME = re.compile(r"^(?=.{1,253}$)(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?$")


def resolve(name: str, timeout: float = RESOLVE_TIMEOUT_S) -> str | None:
    """Why `name` does not resolve (None when it does), never waiting longer than `timeout`."""
    try:
        ipaddress.ip_address(name.split("@")[-1])
        return None
    except ValueError:
        pass
    if not HOST_NAME.match(name.split("@")[-1]):
        return f"{name!r} is not a valid host name"
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        pool.submit(socket.getaddrinfo, name, 22).result(timeout=timeout)
        return None
    except concurrent.futures.TimeoutError:
        return f"looking up {name} took more than {timeout:.0f} s"
    except OSError as exc:
        return f"{name} does not resolve ({exc.strerror or exc})"
    finally:
        pool.shutdown(wait=False)


def ssh(host: str, command: list[str], timeout: float = SSH_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run a command on `host` without prompting (keys only); TimeoutExpired past `timeout`."""
    import shlex

    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(timeout)}", host, shlex.join(command)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def check_hosts(hostfile: Hostfile) -> None:
    """Every host other than this one resolves and lets us in over ssh."""
    problems = []
    for host in dict.fromkeys(h.ssh for h in hostfile.hosts if not h.is_local):
        why = resolve(host)
        if why is None:
            try:
                done = ssh(host, ["true"])
                if done.returncode != 0:
                    why = f"ssh to {host} failed: {(done.stderr or '').strip() or f'exit status {done.returncode}'}"
            except subprocess.TimeoutExpired:
                why = f"ssh to {host} did not answer within {SSH_TIMEOUT_S:.0f} s"
            except FileNotFoundError:
                why = "ssh is not installed on this machine"
        if why:
            problems.append(why)
    if problems:
        raise ClusterError(
            "cannot reach every host: "
            + "; ".join(problems)
            + ". Check the names in the hostfile, that each Mac is on, and that `ssh HOST true` works without a password."
        )


def check_model_files(hostfile: Hostfile, model_spec: str, local: Path) -> None:
    """The model files (their fingerprint) are the same on every host; hosts named 127.0.0.1 read this folder."""
    prints = {"this Mac": fingerprint(local)}
    problems = []
    for host in dict.fromkeys(h.ssh for h in hostfile.hosts if not h.is_local):
        try:
            done = ssh(host, [sys.executable, "-m", "macapp.core.cluster.fingerprint", model_spec], timeout=120)
            answer = json.loads(done.stdout or "{}")
        except subprocess.TimeoutExpired:
            problems.append(f"{host}: checking the model files took more than 2 minutes")
            continue
        except ValueError:
            problems.append(
                f"{host}: could not check the model files ({(done.stderr or '').strip()[:200] or 'no answer'}); is Qwen Desk installed at {sys.executable} there?"
            )
            continue
        if "error" in answer:
            problems.append(f"{host}: {answer['error']}")
            continue
        prints[host] = Fingerprint(answer.get("files") or {})
    compare_fingerprints(prints, problems)


def compare_fingerprints(prints: dict[str, Fingerprint], problems: list[str] | None = None) -> None:
    """ClusterError naming the hosts whose files differ from the first host's (and any `problems` found before)."""
    (first, reference), *others = prints.items()
    problems = list(problems or [])
    for host, other in others:
        differ = reference.differences(other)
        if differ:
            problems.append(f"{host} differs from {first} in {', '.join(differ[:5])}{' …' if len(differ) > 5 else ''}")
    if problems:
        raise ClusterError("the model is not the same on every host: " + "; ".join(problems) + ". Download the same build on each host.")


# --- running ---


def free_base_port(n: int) -> int:
    """A port P with P .. P+n-1 free on the loopback (for hostfiles of 127.0.0.1 hosts only)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base: int = s.getsockname()[1]
        if base + n >= 65535:
            continue
        socks = []
        try:
            for i in range(n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise ClusterError("no free ports on the loopback for the ring backend")


class ClusterRun:
    """`mlx.launch` running `command` on every host of the plan, watched until it ends (see the module docstring)."""

    def __init__(
        self,
        plan: Plan,
        command: list[str],
        connect_timeout: float = CONNECT_TIMEOUT_S,
        interactive: bool = False,
        stdout: int | None = None,
        stall_limit_s: float = 0.0,
        load_limit_s: float = 0.0,
    ):
        """`stdout`: where rank 0's output goes (default this process's stdout; subprocess.PIPE to read it).
        `stall_limit_s` / `load_limit_s`: fixed bounds on rank 0's waits for the other ranks while running /
        loading (default: watchdog.py's)."""
        self.plan = plan
        self.stall_limit_s = stall_limit_s
        self.load_limit_s = load_limit_s
        self.stdout = stdout
        self.command = command
        self.connect_timeout = connect_timeout
        self.interactive = interactive
        self.joined: set[int] = set()
        self.exits: dict[int, int | None] = {}  # rank -> exit status (None: killed by mlx.launch)
        self.other_files: set[int] = set()  # the ranks rank 0 found holding other model files than its own
        self.rank0_done = False
        self.rank0_gave_up = False  # rank 0's watchdog ended it: the others did not answer (it said so)
        self.fault: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._control = tempfile.mkdtemp(prefix="qwen-desk-cluster-")
        self._stop_by: float | None = None  # after stop(): when the whole group is ended regardless
        self._ended_at: set[int] | None = None  # the ranks that had ended when the group was ended from here

    @property
    def rank0_pidfile(self) -> Path:
        return self.pidfile(0)

    def pidfile(self, rank: int) -> Path:
        """Where a rank on this machine writes its pid once it has joined."""
        return Path(self._control) / f"rank{rank}.pid"

    def argv(self) -> list[str]:
        spec = RankSpec(self.plan.shard, self.plan.backend, self.plan.hostfile.size, self._control, self.stall_limit_s, self.load_limit_s)
        argv = [mlx_launch(), "--hostfile", str(self.plan.hostfile.path), "--backend", self.plan.backend, "--env", f"{ENV}={spec.to_env()}"]
        if all(h.is_local for h in self.plan.hostfile.hosts):
            argv += ["--starting-port", str(free_base_port(self.plan.hostfile.size))]
        return argv + ["--", *self.command]

    def start(self) -> None:
        # mlx.launch writes each local rank's pid (and the ring's host list) to a `mktemp` file it never removes:
        # in the control folder they go when the run is closed
        env = {**os.environ, "TMPDIR": self._control}
        self.proc = subprocess.Popen(self.argv(), stdin=subprocess.PIPE, stdout=self.stdout, stderr=subprocess.PIPE, process_group=0, env=env)
        self._reader = threading.Thread(target=self._read_stderr, name="cluster-stderr", daemon=True)
        self._reader.start()
        if self.interactive:
            threading.Thread(target=self._relay_stdin, name="cluster-stdin", daemon=True).start()

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            if m := _READY.search(line):
                with self._lock:
                    self.joined.add(int(m.group(1)))
                if m.group(1) == "0" and not self.rank0_pidfile.exists():  # written before the line, when here
                    sys.stderr.write(self.rank0_elsewhere() + "\n")
                continue
            if DONE in line:
                self.rank0_done = True
                continue
            if m := _OTHER_FILES.search(line):
                with self._lock:
                    self.other_files.add(int(m.group(1)))
                continue
            if m := _EXIT.search(line):
                with self._lock:
                    self.exits[int(m.group(1))] = int(m.group(2)) if m.group(2) is not None else None
                continue
            if _NOISE.search(line):
                continue
            if line.startswith(GAVE_UP):
                self.rank0_gave_up = True
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def rank0_elsewhere(self) -> str:
        """What it means that rank 0 (the hostfile's first host) runs on another Mac than this one."""
        return (
            f"qwen-desk: rank 0 runs on {self.plan.hostfile.hosts[0].ssh}, not on this Mac: the chat's history and the "
            "API live there, and Ctrl-C cannot stop a reply from here. To keep them here, list this Mac first in the hostfile."
        )

    def _relay_stdin(self) -> None:
        """The terminal's input to mlx.launch (which hands it to rank 0); at end of input, /quit."""
        assert self.proc is not None and self.proc.stdin is not None
        try:
            while chunk := os.read(sys.stdin.fileno(), 4096):
                self.proc.stdin.write(chunk)
                self.proc.stdin.flush()
            self.proc.stdin.write(b"/quit\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass

    def interrupt(self) -> bool:
        """Ctrl-C: pass it to rank 0 when it runs here (it stops the reply); False when it cannot be."""
        try:
            pid = int(self.rank0_pidfile.read_text())
            os.kill(pid, signal.SIGINT)
            return True
        except (OSError, ValueError):
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM / SIGHUP to the launcher: passed on to rank 0 when it runs here (it ends cleanly and shuts the
        followers down); the whole group is ended if the run is still going 10 s later (at once otherwise)."""
        try:
            os.kill(int(self.rank0_pidfile.read_text()), sig)
            self._stop_by = time.monotonic() + 10 * GRACE_S / 3
        except (OSError, ValueError):
            self._stop_by = time.monotonic()

    def _cause(self) -> str | None:
        """The rank whose end ended the run, if one did: a follower that died or was killed (not one that only
        lost rank 0), or rank 0 killed by a signal nobody here sent. mlx.launch reports ranks in any order."""
        hosts = self.plan.hostfile.hosts
        with self._lock:
            exits = dict(self.exits)
            other_files = sorted(self.other_files)
        if differ := other_files or [r for r, code in sorted(exits.items()) if r != 0 and code == MODEL_DIFFERS]:
            return f"rank {differ[0]} ({hosts[differ[0]].ssh}) has other model files than rank 0: download the same build on each host"
        if self._ended_at is not None:  # a rank ended from here (after rank 0, or after a stop) is not to blame
            exits = {r: code for r, code in exits.items() if r in self._ended_at}
        if self.rank0_gave_up:  # nor one mlx.launch ended after rank 0's watchdog gave up on it
            exits = {r: code for r, code in exits.items() if r == 0 or (code is not None and code >= 0)}
        for r, code in sorted(exits.items(), key=lambda item: item[0] == 0):  # followers first
            killed = code is None or code < 0
            if (r != 0 and code not in (0, FOLLOWER_LOST)) or (r == 0 and killed and self._stop_by is None):
                how = "was killed" if code is None else (f"was killed by signal {-code}" if code < 0 else f"exited with status {code}")
                return f"rank {r} ({hosts[r].ssh}) {how}"
        return None

    def _check(self, started: float) -> str | None:
        hosts = self.plan.hostfile.hosts
        with self._lock:
            joined = set(self.joined)
            rank0_over = self.rank0_done or 0 in self.exits
        if cause := self._cause():
            return cause
        if len(joined) < len(hosts) and time.monotonic() - started > self.connect_timeout and not rank0_over:
            missing = ", ".join(f"rank {r} ({hosts[r].ssh})" for r in range(len(hosts)) if r not in joined)
            return (
                f"{missing} did not join within {self.connect_timeout:.0f} s: check that each host can reach the others "
                f"at the hostfile's IP addresses ({self.plan.backend} backend) and that no firewall blocks the ports"
            )
        return None

    def wait(self) -> int:
        """Until mlx.launch ends; the run's exit status (rank 0's, or 1 after a fault)."""
        assert self.proc is not None
        started = time.monotonic()
        done_at = None
        while self.proc.poll() is None:
            if self.fault is None and (fault := self._check(started)):
                self.fault = fault
                print(f"qwen-desk: {fault}; stopping every rank.", file=sys.stderr, flush=True)
                self._end(grace=GRACE_S)
                break
            if self._stop_by is not None and time.monotonic() > self._stop_by:
                self._end_lingering()
                break
            if done_at is None and (self.rank0_done or 0 in self.exits):
                done_at = time.monotonic()
            if done_at is not None and time.monotonic() - done_at > 2 * GRACE_S:
                self._end_lingering()  # rank 0 has ended but a follower lingers (stuck, or stopped: mlx.launch waits on it)
                break
            time.sleep(0.05)
        self.proc.wait()
        self._reader.join(timeout=5)  # mlx.launch's last lines (a rank's end may be reported after rank 0's)
        if self.fault is None and (fault := self._cause()):
            self.fault = fault
            print(f"qwen-desk: {fault}; every rank has been stopped.", file=sys.stderr, flush=True)
        self._end(grace=0)  # anything of the group still there
        if self.fault is not None:
            return 1
        code = self.exits.get(0, 0)
        return 1 if code is None else (code if code >= 0 else 128 - code)

    def _end_lingering(self) -> None:
        """End the group now, blaming no rank for an end that comes from this."""
        with self._lock:
            self._ended_at = set(self.exits)
        self._end(grace=0)

    def _end(self, grace: float) -> None:
        """Let mlx.launch wind down for `grace` seconds, then terminate the whole process group."""
        assert self.proc is not None
        deadline = time.monotonic() + grace
        while grace and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            end = time.monotonic() + wait
            while time.monotonic() < end:
                try:
                    os.killpg(self.proc.pid, 0)
                except ProcessLookupError:
                    return
                self.proc.poll()
                time.sleep(0.05)

    def close(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        import shutil

        shutil.rmtree(self._control, ignore_errors=True)
