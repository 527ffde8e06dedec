"""`qwen-desk fit --hosts N`: the JSON contract and the human output."""

import json

import pytest

from macapp.cli import main


def fit(capsys, *argv):
    code = main(["fit", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_adds_hosts_shard_and_the_busiest_hosts_bytes(capsys):
    code, out, _ = fit(capsys, "Qwen3.5-397B-A17B", "--bits", "8", "--chip", "M3 Ultra", "--memory", "256GB", "--hosts", "2", "--json")
    data = json.loads(out)
    assert code == 0 and data["hosts"] == 2 and data["shard"] == "tensor"
    per = data["per_host_bytes"]
    assert set(per) >= {"weights_share", "whole_weights", "kv_cache", "state", "overhead", "total"}
    assert per["total"] == per["weights_share"] + per["whole_weights"] + per["kv_cache"] + per["state"] + per["overhead"]
    assert per["total"] <= data["budget_bytes"] < data["total_bytes"]
    assert data["verdict"] in ("fits", "tight") and data["single_host_verdict"] == "too_big"
    assert data["max_context"] > 0 and data["single_host_max_context"] == 0
    assert data["link"]["name"] == "thunderbolt5-rdma" and data["exchange_ms_per_token"] > 0
    assert data["decode_tps_estimate"] > 0 and len(data["hosts_detail"]) == 2


def test_json_pipeline_when_the_heads_do_not_divide(capsys):
    code, out, _ = fit(capsys, "Qwen3.5-397B-A17B", "--chip", "M4 Max", "--memory", "128GB", "--hosts", "3", "--shard", "tensor", "--json")
    data = json.loads(out)
    assert code == 0 and data["shard"] == "pipeline" and not data["tensor_split_possible"]
    assert any("attention heads" in p for p in data["tensor_problems"])
    assert [h["layers"] for h in data["hosts_detail"]] == [[40, 60], [20, 40], [0, 20]]


def test_human_output_names_the_split_and_the_link(capsys):
    code, out, _ = fit(capsys, "Qwen3.5-122B-A10B", "--bits", "8", "--chip", "M4 Max", "--memory", "64GB", "--hosts", "3", "--link", "10gbe-tcp")
    assert code == 0
    for words in ("3 ×", "pipeline", "busiest host", "every host keeps whole", "KV cache", "10 Gigabit Ethernet", "rank 0 runs the last"):
        assert words in out, words


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--hosts", "0"], "between 1"),
        (["--hosts", "two"], "not a number"),
        (["--hosts", "2", "--shard", "diagonal"], "invalid choice"),
        (["--hosts", "2", "--link", "wifi"], "invalid choice"),
    ],
)
def test_bad_flags(capsys, argv, needle):
    with pytest.raises(SystemExit) as exc:
        main(["fit", "Qwen3.5-0.8B", *argv])
    assert exc.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("flag", [["--shard", "pipeline"], ["--link", "10gbe-tcp"]])
def test_cluster_flags_need_hosts(capsys, flag):
    code, out, err = fit(capsys, "Qwen3.5-0.8B", *flag)
    assert code == 2 and "--shard and --link go with --hosts N" in err and out == ""
