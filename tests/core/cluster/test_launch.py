"""Starting the ranks: everything checked first, and every fault a clear message with no process left behind."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from macapp.core.cluster.launch import ClusterError, ClusterRun, ShardError, prepare, resolve
from macapp.core.cluster.split import Shard
from tests.core.cluster.conftest import HANG_S, LOCAL, drive_command


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie of ours is gone too
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return False


def test_default_split_is_tensor_where_the_heads_divide_else_pipeline(two_local, tiny_moe_path, tiny_three_heads_path):
    assert prepare(two_local, None, str(tiny_moe_path), None).shard is Shard.TENSOR
    plan = prepare(two_local, None, str(tiny_three_heads_path), None)
    assert plan.shard is Shard.PIPELINE and any("attention heads (3)" in p for p in plan.tensor_problems)
    assert plan.backend == "ring"


def test_tensor_asked_for_heads_that_do_not_divide(two_local, tiny_three_heads_path):
    with pytest.raises(ShardError, match=r"cannot split this model 2 ways \(attention heads \(3\) do not divide by 2.*use --shard pipeline"):
        prepare(two_local, "ring", str(tiny_three_heads_path), Shard.TENSOR)


def test_a_host_that_cannot_be_reached(write_hostfile, tiny_moe_path):
    # 127.0.0.2 is this machine's loopback, but not named 127.0.0.1: it is reached over ssh, where nothing answers
    hostfile = write_hostfile([LOCAL, {"ssh": "127.0.0.2", "ips": ["127.0.0.2"]}])
    started = time.monotonic()
    with pytest.raises(ClusterError) as exc:
        prepare(hostfile, "ring", str(tiny_moe_path), None)
    assert time.monotonic() - started < HANG_S
    assert "cannot reach every host: ssh to 127.0.0.2 failed" in str(exc.value) and "ssh HOST true" in str(exc.value)


def test_a_host_name_that_cannot_resolve_is_said_without_asking_the_network(write_hostfile, tiny_moe_path):
    assert resolve("mac studio") == "'mac studio' is not a valid host name"
    hostfile = write_hostfile([LOCAL, {"ssh": "mac_studio", "ips": ["127.0.0.1"]}])
    with pytest.raises(ClusterError, match="'mac_studio' is not a valid host name"):
        prepare(hostfile, "ring", str(tiny_moe_path), None)


def test_a_model_that_is_not_here(two_local, tmp_path):
    with pytest.raises(ClusterError, match="No model folder"):
        prepare(two_local, "ring", str(tmp_path / "nothing"), None)


def test_a_rank_that_never_joins_ends_the_run(two_local, tiny_moe_path):
    plan = prepare(two_local, "ring", str(tiny_moe_path), None)
    run = ClusterRun(plan, [sys.executable, "-c", "import time; time.sleep(120)"], connect_timeout=2)
    started = time.monotonic()
    run.start()
    assert run.wait() == 1
    run.close()
    assert time.monotonic() - started < HANG_S
    assert "rank 0 (127.0.0.1), rank 1 (127.0.0.1) did not join within 2 s" in run.fault
    assert group_gone(run.proc.pid)


def test_a_run_leaves_nothing_in_the_temp_folder(two_local, tiny_moe_path, tmp_path, monkeypatch):
    """mlx.launch writes files with `mktemp` for each local rank (its pid, the ring's hosts) and never removes them."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # where the launched processes' mktemp would write
    plan = prepare(two_local, "ring", str(tiny_moe_path), None)
    run = ClusterRun(plan, [sys.executable, "-c", "pass"])
    run.start()
    assert run.wait() == 0
    run.close()
    assert list(temp.iterdir()) == [] and not os.path.exists(run._control)


@pytest.mark.parametrize("victim", [1, 0])
def test_a_rank_killed_mid_reply(two_local, tiny_moe_path, victim):
    plan = prepare(two_local, "ring", str(tiny_moe_path), None)
    run = ClusterRun(plan, drive_command(f"{tiny_moe_path}:tensor", max_tokens=100000, turns=1), stdout=subprocess.PIPE)
    run.start()
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(run.proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 2 * HANG_S
    while not any(b"streaming" in line for line in lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(b"streaming" in line for line in lines), lines
    rank0, rank1 = (int(run.pidfile(r).read_text()) for r in (0, 1))
    os.kill((rank0, rank1)[victim], signal.SIGKILL)
    killed = time.monotonic()
    assert run.wait() == 1
    run.close()
    assert time.monotonic() - killed < HANG_S
    assert run.fault == f"rank {victim} (127.0.0.1) was killed by signal 9"
    assert group_gone(run.proc.pid) and pid_gone(rank0) and pid_gone(rank1)
    reader.join(5)
    replies = [json.loads(line) for line in lines if line.startswith(b"{")]
    assert not any("tokens" in r for r in replies)  # the reply never finished: one rank lost its peer mid-reply


def test_other_model_files_on_a_rank_are_found_before_loading(two_local, tiny_moe_path, tiny_moe_4bit_path):
    """Checked again inside the run, over the group: here rank 1 reads another build, as another host could."""
    plan = prepare(two_local, "ring", str(tiny_moe_path), None)
    command = drive_command(f"{tiny_moe_path}:tensor", turns=1, follower_model=tiny_moe_4bit_path)
    run = ClusterRun(plan, command, stdout=subprocess.PIPE)
    started = time.monotonic()
    run.start()
    out = run.proc.stdout.read().decode()
    assert run.wait() == 1
    run.close()
    assert time.monotonic() - started < HANG_S
    assert run.fault == "rank 1 (127.0.0.1) has other model files than rank 0: download the same build on each host"
    assert "tokens" not in out and group_gone(run.proc.pid)


class Replayed(ClusterRun):
    """mlx.launch replaced by a process that writes the lines it wrote in a recorded run, in their order."""

    def __init__(self, plan, lines: list[str]):
        super().__init__(plan, [])
        self.lines = lines

    def argv(self) -> list[str]:
        return [sys.executable, "-c", f"import sys; sys.stderr.write({chr(10).join(self.lines) + chr(10)!r}); sys.exit(1)"]


def test_a_follower_ended_by_mlx_launch_after_rank_0_found_its_other_files(two_local, tiny_moe_path):
    """Under load mlx.launch may end rank 1 (SIGTERM, after rank 0's exit) before rank 1 exits with its own status:
    the fault still names the model files, which rank 0 reported, not the signal."""
    plan = prepare(two_local, "ring", str(tiny_moe_path), None)
    run = Replayed(
        plan,
        [
            "qwen-desk-cluster: rank 0 of 2 joined",
            "qwen-desk-cluster: rank 1 of 2 joined",
            "qwen-desk-cluster: other model files on rank 1",
            "qwen-desk: The model files are not the same on every host: rank 1 holds other files than rank 0.",
            "qwen-desk-cluster: rank 0 done",
            "\x1b[33m[WARN] Node with rank 0 exited with code 1",
            "\x1b[33m[WARN] Node with rank 1 exited with code -15",
        ],
    )
    run.start()
    assert run.wait() == 1
    run.close()
    assert run.fault == "rank 1 (127.0.0.1) has other model files than rank 0: download the same build on each host"


def test_a_follower_that_stops_answering_mid_reply(two_local, tiny_moe_path):
    """Alive but stuck (SIGSTOP): MLX's collective would wait forever; rank 0's watchdog ends the run."""
    plan = prepare(two_local, "ring", str(tiny_moe_path), None)
    run = ClusterRun(plan, drive_command(f"{tiny_moe_path}:tensor", max_tokens=100000, turns=1), stdout=subprocess.PIPE, stall_limit_s=3)
    run.start()
    lines = []
    threading.Thread(target=lambda: lines.extend(run.proc.stdout), daemon=True).start()
    deadline = time.monotonic() + 2 * HANG_S
    while not any(b"streaming" in line for line in lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    rank1 = int(run.pidfile(1).read_text())
    os.kill(rank1, signal.SIGSTOP)
    stopped = time.monotonic()
    code = run.wait()
    run.close()
    assert time.monotonic() - stopped < HANG_S
    assert code == 5  # rank 0's own exit: watchdog.STALLED
    assert group_gone(run.proc.pid) and pid_gone(rank1)


def test_a_follower_stuck_while_loading_ends_the_run(two_local, tiny_moe_path, capfd):
    """A rank that joined but never reaches the model-files check (stuck reading its disk, say): rank 0's wait
    over the group is bounded like every other, with a message naming the load."""
    plan = prepare(two_local, "ring", str(tiny_moe_path), None)
    run = ClusterRun(plan, drive_command(f"{tiny_moe_path}:tensor", turns=1, follower_stall=600), stdout=subprocess.PIPE, load_limit_s=3)
    run.start()
    out = run.proc.stdout.read().decode()
    code = run.wait()
    run.close()
    assert code == 5  # rank 0's own exit: watchdog.STALLED
    assert "have not answered for 3 s (the model-files check)" in capfd.readouterr().err
    assert "tokens" not in out and group_gone(run.proc.pid)


def test_rank_0_on_another_mac_is_said(two_local, tiny_moe_path, capfd):
    """Each rank here joins without saying its pid (as rank 0 on another Mac could not): the user hears where
    rank 0 is and what that means. (A rank 0 here says its pid: tests/cli/test_chat_cluster.py hears nothing.)"""
    from macapp.core.cluster.rank import READY

    line = READY.format(rank="{os.environ['MLX_RANK']}", size=2)
    joins = f'import os, sys; print(f"{line}", file=sys.stderr, flush=True)'
    run = ClusterRun(prepare(two_local, "ring", str(tiny_moe_path), None), [sys.executable, "-c", joins])
    run.start()
    assert run.wait() == 0
    run.close()
    assert run.joined == {0, 1}
    assert "rank 0 runs on 127.0.0.1, not on this Mac: the chat's history and the API live there" in capfd.readouterr().err
