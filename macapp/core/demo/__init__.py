"""The demo: tiny random-weights Qwen3.5 models of the real architecture, made on this machine in about a second
with no network, which the real engine, chat and server run.

- `tiny_model`: the text model (`make_tiny_model`), whose greedy replies follow a script (tests rely on it too);
- `tiny_vlm`: the same with a vision tower, for pictures (the self-test reads one through it);
- `model`: the demo model a newcomer tries from the window or `qwen-desk demo`, and the words it answers with.
"""
