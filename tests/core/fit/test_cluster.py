"""The several-Macs fit: per-host shares add up to the one-Mac figures; the tensor split's divisibility rules."""

import dataclasses

import pytest

from macapp.core import catalog, hardware
from macapp.core.fit import weights
from macapp.core.cluster.split import Shard, default_shard, tensor_split_problems
from macapp.core.fit.cluster import cluster_estimate, hosts_needed, pipeline_layers

ULTRA = hardware.what_if_machine("M3 Ultra", 256 * 1024**3)
MAX = hardware.what_if_machine("M4 Max", 128 * 1024**3)
BUILDS = [("Qwen3.5-397B-A17B", 4), ("Qwen3.5-122B-A10B", 8), ("Qwen3.5-27B", 4), ("Qwen3.5-0.8B", 8)]


def ref(name, bits):
    return catalog.resolve_model(name, bits)


@pytest.mark.parametrize("name,bits", BUILDS)
@pytest.mark.parametrize("hosts", [1, 2, 4])
@pytest.mark.parametrize("shard", list(Shard))
def test_shares_add_up_to_the_one_mac_figures(name, bits, hosts, shard):
    model = ref(name, bits)
    e = cluster_estimate(model, 32768, ULTRA, hosts, shard=shard)
    single = e.single
    if e.shard is Shard.TENSOR and hosts > model.arch.num_key_value_heads:
        # mlx-lm repeats the KV heads: each host keeps its own copy of one, reported as duplicated
        assert e.duplicated_bytes > 0
    else:
        assert e.duplicated_bytes == 0
    weights = sum(h.weights_share for h in e.per_host) + e.per_host[0].whole_weights
    kv = sum(h.kv_cache for h in e.per_host)
    dup_kv = kv - single.kv_cache_bytes
    assert weights + dup_kv == single.weights_bytes + e.duplicated_bytes
    if e.duplicated_bytes == 0:
        assert weights == single.weights_bytes and kv == single.kv_cache_bytes
    assert sum(h.state for h in e.per_host) == single.state_bytes
    for h in e.per_host:
        assert h.total == h.weights_share + h.whole_weights + h.kv_cache + h.state + h.overhead
    assert e.busiest.total == max(h.total for h in e.per_host)
    if hosts == 1:
        assert e.busiest.total == single.total_bytes and e.verdict == single.verdict and e.max_context == single.max_context


def test_every_host_keeps_the_embedding_whole_and_pipeline_hosts_the_head_too():
    model = ref("Qwen3.5-122B-A10B", 8)
    tensor = cluster_estimate(model, 32768, ULTRA, 2, shard=Shard.TENSOR)
    pipe = cluster_estimate(model, 32768, ULTRA, 2, shard=Shard.PIPELINE)
    embed = weights.quantized_bytes(model.arch.vocab_size, model.arch.hidden_size, 8, 64)
    assert tensor.busiest.whole_weights > embed * 0.9  # the embedding (the untied head is split)
    assert pipe.busiest.whole_weights > 2 * embed * 0.9  # embedding and head on every stage
    assert pipe.busiest.weights_share < tensor.busiest.weights_share  # fewer whole parts shared out in tensor mode


def test_pipeline_split_is_mlx_lms():
    assert pipeline_layers(60, 3) == [(40, 60), (20, 40), (0, 20)]
    assert pipeline_layers(10, 4) == [(7, 10), (4, 7), (2, 4), (0, 2)]  # low ranks get the extra layers
    model = ref("Qwen3.5-27B", 4)
    e = cluster_estimate(model, 8192, ULTRA, 3, shard=Shard.PIPELINE)
    assert [h.layers for h in e.per_host] == pipeline_layers(64, 3)
    # rank 0 (22 layers, the last ones) is the busiest; its KV share is its full-attention layers' part
    assert e.busiest.rank == 0
    full = sum((i + 1) % 4 == 0 for i in range(42, 64))
    assert e.busiest.kv_cache == pytest.approx(e.single.kv_cache_bytes * full / 16, abs=1)


def test_tensor_needs_the_head_counts_to_divide():
    arch = ref("Qwen3.5-397B-A17B", 4).arch  # 32 q heads, 2 KV heads, 16/64 DeltaNet heads
    assert tensor_split_problems(arch, 2) == []
    assert tensor_split_problems(arch, 4) == []  # KV heads repeated: 4 is a multiple of 2
    three = tensor_split_problems(arch, 3)
    assert any("attention heads (32)" in p for p in three)
    assert any("DeltaNet key heads (16)" in p for p in three)
    assert tensor_split_problems(arch, 32) != []  # DeltaNet key heads (16) cannot be cut 32 ways
    odd = dataclasses.replace(arch, num_key_value_heads=3, num_attention_heads=24)
    assert any("KV heads" in p for p in tensor_split_problems(odd, 2))
    assert default_shard(arch, 3) is Shard.PIPELINE and default_shard(arch, 2) is Shard.TENSOR


def test_quantized_tensor_split_keeps_whole_groups():
    arch = dataclasses.replace(ref("Qwen3.5-0.8B", 4).arch, intermediate_size=3584 + 64)
    assert tensor_split_problems(arch, 2, bits=None) == []
    assert any("quantization groups" in p for p in tensor_split_problems(arch, 2, bits=4))


def test_tensor_asked_but_impossible_sizes_the_pipeline():
    e = cluster_estimate(ref("Qwen3.5-397B-A17B", 8), 32768, ULTRA, 3, shard=Shard.TENSOR)
    assert e.shard is Shard.PIPELINE and e.requested_shard is Shard.TENSOR and e.tensor_problems
    assert "not possible" in e.derivation[0]


def test_verdict_and_max_context_are_judged_per_host():
    model = ref("Qwen3.5-397B-A17B", 8)  # ~429 GB: too big for one 256 GB Mac
    one = cluster_estimate(model, 32768, ULTRA, 1)
    two = cluster_estimate(model, 32768, ULTRA, 2)
    assert one.verdict == "too_big" and one.max_context == 0
    assert two.verdict in ("fits", "tight") and two.max_context > 32768
    assert two.busiest.total <= ULTRA.budget_bytes < two.single.total_bytes
    assert hosts_needed(model, 32768, ULTRA) == 2
    assert hosts_needed(ref("Qwen3.5-27B", 4), 32768, ULTRA) == 1
    assert hosts_needed(model, 32768, hardware.what_if_machine("M4", 16 * 1024**3)) is None


def test_speed_counts_the_exchanges_over_the_link():
    model = ref("Qwen3.5-122B-A10B", 8)
    rdma = cluster_estimate(model, 4096, ULTRA, 2, link="thunderbolt5-rdma")
    tcp = cluster_estimate(model, 4096, ULTRA, 2, link="10gbe-tcp")
    assert 0 < rdma.exchange_ms_per_token < tcp.exchange_ms_per_token
    assert tcp.decode_tps_estimate < rdma.decode_tps_estimate
    assert rdma.decode_tps_estimate > rdma.single.decode_tps_estimate  # each host reads half the weights
    pipe = cluster_estimate(model, 4096, ULTRA, 2, shard=Shard.PIPELINE)
    assert pipe.decode_tps_estimate < pipe.single.decode_tps_estimate  # one stream passes the stages in turn
    assert "Thunderbolt 5" in rdma.to_json()["link"]["description"]
    with pytest.raises(ValueError, match="link"):
        cluster_estimate(model, 4096, ULTRA, 2, link="wifi")


def test_bad_host_counts_are_refused():
    model = ref("Qwen3.5-0.8B", 8)
    with pytest.raises(ValueError, match="between 1"):
        cluster_estimate(model, 4096, ULTRA, 0)
    short = dataclasses.replace(model, arch=dataclasses.replace(model.arch, num_hidden_layers=8))
    with pytest.raises(ValueError, match="8 layers"):
        cluster_estimate(short, 4096, ULTRA, 12, shard=Shard.PIPELINE)
