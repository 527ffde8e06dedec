"""The fit: will a build fit this Mac (or several) at this context, how fast will it run, and what to do if not.

Arithmetic on a build's config and a machine's profile (macapp.core.hardware): no MLX, no loaded model. Every
front end shows these figures (library badge, details pane, load guardrail, `qwen-desk fit`, the API's pool size).
Modules:

- `estimate`: the one-Mac figure every screen shows (`estimate()`): weights, KV cache, DeltaNet state, overhead,
  the decode speed, the largest context and how many agent sessions fit; mlx-lm's prefill step (DEFAULT_PREFILL_STEP).
- `weights`: a build's weight bytes (as mlx-lm loads them, quantized as MLX quantizes) and parameters, from its
  architecture: the one count estimate and cluster share.
- `prefill_time`: how long reading a prompt takes (the prefill model behind `ttft_estimate_s`; the reading itself is
  macapp.core.engine.prefill).
- `cluster`: the same on several Macs: each host's share under a tensor or pipeline split (the split rule itself
  is macapp.core.cluster.split), the link's exchange time, how many Macs a build needs.
- `picture_cost`: what pictures add: the vision tower's weight bytes and one picture's activations at the
  processor's limits (ProcessorLimits, which the tower's runner also reads).
- `advice`: the ways out of a too-big verdict, cheapest first (`advise`).
"""
