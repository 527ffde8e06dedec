"""MLX's hostfile format: what parses, and a clear message for everything that does not."""

import pytest

from macapp.core.cluster.hostfile import HostfileError, read_hostfile

TWO = [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "mac-b.local", "ips": ["192.168.1.11"]}]


def test_a_list_of_hosts(write_hostfile):
    hf = read_hostfile(write_hostfile(TWO))
    assert hf.size == 2 and hf.hosts[0].is_local and not hf.hosts[1].is_local
    assert hf.hosts[1].ips == ("192.168.1.11",)
    hf.check_backend("ring")


def test_the_object_form_with_backend_and_rdma(write_hostfile):
    hosts = [dict(h, rdma=rdma) for h, rdma in zip(TWO, ([None, "rdma_en2"], ["rdma_en2", None]))]
    hf = read_hostfile(write_hostfile({"backend": "jaccl", "envs": ["MLX_METAL_FAST_SYNCH=1"], "hosts": hosts}))
    assert hf.backend == "jaccl" and hf.envs == ("MLX_METAL_FAST_SYNCH=1",)
    hf.check_backend("jaccl")


@pytest.mark.parametrize(
    "content,needle",
    [
        ('[{"ssh": "a",}]', "not valid JSON (line 1, column"),
        ('{"ssh": "a"}', "must hold a JSON list of hosts"),
        ('["mac-a", "mac-b"]', "host 0 is str, not an object"),
        ('[{"ips": ["10.0.0.1"]}, {"ssh": "b"}]', 'host 0 has no "ssh" host name'),
        ('[{"ssh": "a", "ips": "10.0.0.1"}, {"ssh": "b"}]', '"ips" must be a list'),
        ('[{"ssh": "a", "ips": ["mac-a.local"]}, {"ssh": "b"}]', "'mac-a.local' is not an IP address"),
        ('[{"ssh": "a", "ips": ["10.0.0.1"]}]', "lists 1 host: several Macs means at least two"),
        ("", "not valid JSON"),
    ],
)
def test_bad_hostfiles_say_what_and_where(write_hostfile, content, needle):
    path = write_hostfile(content)
    with pytest.raises(HostfileError) as exc:
        read_hostfile(path)
    assert needle in str(exc.value) and str(path) in str(exc.value)


def test_missing_file(tmp_path):
    with pytest.raises(HostfileError, match="no hostfile at"):
        read_hostfile(tmp_path / "nope.json")


def test_backend_needs_what_mlx_launch_needs(write_hostfile):
    no_ips = read_hostfile(write_hostfile([{"ssh": "a"}, {"ssh": "b"}]))
    with pytest.raises(HostfileError, match="ring backend needs an IP address"):
        no_ips.check_backend("ring")
    with pytest.raises(HostfileError, match="rdma"):
        read_hostfile(write_hostfile(TWO)).check_backend("jaccl")
    with pytest.raises(HostfileError, match="backend must be one of"):
        read_hostfile(write_hostfile(TWO)).check_backend("mpi")
