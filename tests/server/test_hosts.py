"""Bound beyond loopback, the Host check stays on: loopback names, this machine's own names and addresses
(NAME.local included) and the --allow-host names are answered; any other name is refused (DNS rebinding works
against a LAN-bound server too)."""

from __future__ import annotations

import socket

import httpx2
import pytest
from starlette.datastructures import Headers

from macapp.server.config import ServerConfig, machine_names, normal_host
from macapp.server.errors import ErrorKind
from macapp.server.security import SecurityPolicy, check_request
from tests.server.conftest import serve


def check(policy: SecurityPolicy, host: str):
    return check_request(policy, "/v1/chat/completions", "POST", Headers({"host": host}))


def test_machine_names_hold_the_host_name_its_local_name_and_interface_addresses():
    names = machine_names()
    short = socket.gethostname().split(".")[0].lower()
    assert {short, f"{short}.local", "127.0.0.1"} <= names


@pytest.mark.parametrize("header", ["WIDGET.local:8642", "[FE80::1%en0]:8642", "widget.local.:8642"])
def test_names_compare_normalised(header):
    policy = SecurityPolicy(allowed_hosts=frozenset({"widget.local", "fe80::1"}), loopback=False)
    assert check(policy, header) is None


def test_a_network_bind_accepts_this_machines_names_and_allowed_ones_only():
    policy = SecurityPolicy.from_config(ServerConfig(host="0.0.0.0", allowed_hosts=("qwen.lan",)))
    short = socket.gethostname().split(".")[0]
    for ok in ("localhost:8642", "127.0.0.1:8642", f"{short}:8642", f"{short}.local:8642", "qwen.lan", "QWEN.LAN:8642"):
        assert check(policy, ok) is None, ok
    for address in [a for a in machine_names() if ":" not in a][:3]:
        assert check(policy, f"{address}:8642") is None, address
    refused = check(policy, "rebind.example:8642")
    assert refused.kind is ErrorKind.PERMISSION and "--allow-host rebind.example" in refused.message
    assert check(policy, "") is not None


def test_allow_host_on_loopback_and_the_wildcard():
    loopback = SecurityPolicy.from_config(ServerConfig(allowed_hosts=("proxy.example",)))
    assert check(loopback, "proxy.example:443") is None and check(loopback, "other.example") is not None
    assert check(loopback, f"{socket.gethostname()}.local") is not None  # a loopback bind does not take the LAN names
    anything = SecurityPolicy.from_config(ServerConfig(host="0.0.0.0", allowed_hosts=("*",)))
    assert check(anything, "whatever.example") is None


def test_a_server_bound_to_all_addresses_refuses_a_foreign_host_over_http(tiny_dense_path):
    with serve(tiny_dense_path, host="0.0.0.0", allowed_hosts=("qwen.lan",)) as served:
        port = served.server.port
        url = f"http://127.0.0.1:{port}/health"
        assert httpx2.get(url, timeout=30).status_code == 200
        assert httpx2.get(url, headers={"host": f"qwen.lan:{port}"}, timeout=30).status_code == 200
        assert httpx2.get(url, headers={"host": f"{socket.gethostname()}.local:{port}"}, timeout=30).status_code == 200
        refused = httpx2.get(url, headers={"host": f"rebind.example:{port}"}, timeout=30)
        assert refused.status_code == 403 and "rebind.example" in refused.json()["error"]["message"]


def test_normal_host():
    assert normal_host(" [FE80::1%en0] ") == "fe80::1" and normal_host("Mac.Local.") == "mac.local"


def test_serve_takes_allow_host_and_its_help_says_where_the_key_stays_private():
    from macapp.cli import build_parser
    from macapp.cli.serve import _config

    parser = build_parser()
    args = parser.parse_args(["serve", "--model", "m", "--host", "0.0.0.0", "--allow-host", "qwen.lan", "--allow-host", "x.example"])
    assert _config(args).allowed_hosts == ("qwen.lan", "x.example")
    serve_parser = next(a for a in parser._subparsers._group_actions[0].choices.values() if a.prog.endswith("serve"))
    help_text = " ".join(serve_parser.format_help().split())
    assert "QWEN_DESK_API_KEY" in help_text and "process list" in help_text and "--allow-host NAME" in help_text
