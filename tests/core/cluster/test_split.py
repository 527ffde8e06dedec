"""One split rule (cluster.split.choose_split) for the fit, the launcher and the CLI: the cases each used to decide alone."""

import dataclasses

import pytest

from macapp.core import catalog
from macapp.core.cluster.split import Shard, Split, SplitRefused, choose_split


def arch_of(name="Qwen3.5-397B-A17B", bits=4, **changes):
    arch = catalog.resolve_model(name, bits).arch  # 32 q heads, 2 KV heads, 16/64 DeltaNet heads, 60 layers
    return dataclasses.replace(arch, **changes) if changes else arch


def test_the_default_is_tensor_where_the_heads_divide():
    split = choose_split(arch_of(), 2)
    assert split == Split(Shard.TENSOR, 2, None, (), split.why) and "divide by 2" in split.why
    assert not split.fell_back


def test_the_default_is_the_pipeline_where_they_do_not_and_says_why():
    split = choose_split(arch_of(), 3)
    assert split.shard is Shard.PIPELINE and any("attention heads (32)" in p for p in split.tensor_problems)
    assert "not possible" in split.why and not split.fell_back


def test_tensor_asked_but_impossible_is_refused_unless_falling_back():
    with pytest.raises(SplitRefused, match=r"cannot split this model 3 ways \(attention heads \(32\).*use --shard pipeline"):
        choose_split(arch_of(), 3, asked=Shard.TENSOR)
    sized = choose_split(arch_of(), 3, asked=Shard.TENSOR, fall_back=True)  # the fit sizes what would run
    assert sized.shard is Shard.PIPELINE and sized.fell_back and sized.tensor_problems


def test_the_pipeline_asked_for_is_kept_even_where_tensor_would_do():
    split = choose_split(arch_of(), 2, asked=Shard.PIPELINE)
    assert split.shard is Shard.PIPELINE and split.tensor_problems == () and "as asked" in split.why


def test_one_layer_count_check_for_the_pipeline_only():
    short = arch_of(num_hidden_layers=2)
    with pytest.raises(SplitRefused, match="Tiny has 2 layers: a pipeline cannot have 4 stages"):
        choose_split(short, 4, asked=Shard.PIPELINE, name="Tiny")
    with pytest.raises(SplitRefused, match="2 layers"):  # the heads do not divide 3 ways and the pipeline is too short
        choose_split(short, 3, fall_back=True)
    assert choose_split(short, 4).shard is Shard.TENSOR  # every host runs every layer: their count does not matter
    assert choose_split(short, 2, asked=Shard.PIPELINE).shard is Shard.PIPELINE


def test_quantization_groups_count_and_one_host_splits_nothing():
    arch = arch_of("Qwen3.5-0.8B", 4, intermediate_size=3584 + 64)
    assert choose_split(arch, 2, bits=None).shard is Shard.TENSOR
    quantized = choose_split(arch, 2, bits=4)
    assert quantized.shard is Shard.PIPELINE and any("quantization groups" in p for p in quantized.tensor_problems)
    assert choose_split(arch, 1, bits=4, asked=Shard.TENSOR).tensor_problems == ()
