"""A build's weights from its architecture: the bytes mlx-lm loads (quantized as MLX quantizes) and its parameters.

The one count of weight bytes and parameters for the fit (estimate.py) and its split over several Macs (cluster.py):
the (out, in) shapes of every quantizable matrix per layer kind, following mlx-lm's qwen3_5 model, at the build's
bits and group (router gates at 8 bits), plus the norms, conv kernels and DeltaNet parameters never quantized.
"""

from __future__ import annotations

from macapp.core.catalog import Arch, ModelRef

ACT_BYTES = 2  # bf16 activations, KV cache and unquantized weights
STATE_BYTES = 4  # the DeltaNet recurrent state is float32 (mamba_ssm_dtype)


def quantized_bytes(n_out: int, n_in: int, bits: int | None, group: int) -> int:
    """Bytes of one linear/embedding weight: packed values plus a bf16 scale and bias per group."""
    if bits is None or n_in % group:
        return n_out * n_in * ACT_BYTES  # MLX leaves layers whose input is not a multiple of the group unquantized
    return n_out * n_in * bits // 8 + n_out * (n_in // group) * 2 * ACT_BYTES


def layer_tensors(arch: Arch) -> dict[str, list[tuple[int, int]]]:
    """(out, in) shapes of the quantizable matrices per layer kind, following mlx-lm's qwen3_5 model."""
    h = arch.hidden_size
    key_dim = arch.linear_num_key_heads * arch.linear_key_head_dim
    value_dim = arch.linear_num_value_heads * arch.linear_value_head_dim
    linear = [
        (2 * key_dim + value_dim, h),  # in_proj_qkv
        (value_dim, h),  # in_proj_z
        (arch.linear_num_value_heads, h),  # in_proj_b
        (arch.linear_num_value_heads, h),  # in_proj_a
        (h, value_dim),  # out_proj
    ]
    q = arch.num_attention_heads * arch.head_dim
    kv = arch.num_key_value_heads * arch.head_dim
    full = [(2 * q, h), (kv, h), (kv, h), (h, q)]  # q_proj carries the output gate
    return {"linear": linear, "full": full}


def mlp_tensors(arch: Arch, active_only: bool) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(weights at the model's bits, weights MLX keeps at 8 bits) for one layer's MLP."""
    h = arch.hidden_size
    if not arch.is_moe:
        i = arch.intermediate_size
        return [(i, h), (i, h), (h, i)], []
    experts = arch.num_experts_per_tok if active_only else arch.num_experts
    m, s = arch.moe_intermediate_size, arch.shared_expert_intermediate_size
    main = [(m, h)] * (2 * experts) + [(h, m)] * experts
    if s:
        main += [(s, h), (s, h), (h, s)]
    router = [(arch.num_experts, h), (1, h)]  # mlp.gate and shared_expert_gate stay 8-bit
    return main, router


def small_params(arch: Arch) -> tuple[int, int]:
    """(bf16 parameters, float32 parameters) that are never quantized: norms, conv kernels, dt_bias, A_log."""
    h = arch.hidden_size
    key_dim = arch.linear_num_key_heads * arch.linear_key_head_dim
    conv_dim = 2 * key_dim + arch.linear_num_value_heads * arch.linear_value_head_dim
    per_linear = conv_dim * arch.linear_conv_kernel_dim + arch.linear_num_value_heads + arch.linear_value_head_dim
    per_full = 2 * arch.head_dim
    bf16 = h + arch.num_hidden_layers * 2 * h + arch.linear_layers * per_linear + arch.full_attention_layers * per_full
    return bf16, arch.linear_layers * arch.linear_num_value_heads


def _weights(arch: Arch, bits: int | None, group: int, active_only: bool) -> int:
    shapes = layer_tensors(arch)
    total = arch.linear_layers * sum(quantized_bytes(o, i, bits, group) for o, i in shapes["linear"])
    total += arch.full_attention_layers * sum(quantized_bytes(o, i, bits, group) for o, i in shapes["full"])
    main, router = mlp_tensors(arch, active_only)
    router_bits = 8 if bits is not None else None
    total += arch.num_hidden_layers * (
        sum(quantized_bytes(o, i, bits, group) for o, i in main) + sum(quantized_bytes(o, i, router_bits, group) for o, i in router)
    )
    embed = quantized_bytes(arch.vocab_size, arch.hidden_size, bits, group)
    if active_only:
        total += embed  # the output projection reads the whole matrix each token (tied or not)
    else:
        total += embed if arch.tie_word_embeddings else 2 * embed
    bf16, fp32 = small_params(arch)
    return total + bf16 * ACT_BYTES + fp32 * STATE_BYTES


def computed_weights_bytes(arch: Arch, bits: int | None, group_size: int = 64) -> int:
    """Weight bytes of an MLX build computed from the architecture (text model only, as mlx-lm loads it)."""
    return _weights(arch, bits, group_size, active_only=False)


def active_weights_bytes(arch: Arch, bits: int | None, group_size: int = 64) -> int:
    """Weight bytes read to generate one token: every layer's attention, the routed + shared experts, the output head."""
    return _weights(arch, bits, group_size, active_only=True)


def parameter_count(arch: Arch, active_only: bool = False) -> int:
    """Text-model parameters (bf16 bytes / 2), for the 'B' in the name."""
    return _weights(arch, None, 64, active_only) // ACT_BYTES


def weights_of(model: ModelRef) -> tuple[int, bool]:
    """The build's weight bytes, exact from its files when they are known (else computed), and whether they are exact."""
    if model.weights_bytes:
        return int(model.weights_bytes), True
    return computed_weights_bytes(model.arch, model.bits, model.group_size), False
