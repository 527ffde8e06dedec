"""Images through mlx-vlm: which builds see, reading pictures safely, what they cost, and running them.

UI-free, and mlx-vlm is imported only when a picture is actually run (`runner`), so starting the app and
text-only chats never pay for it. Modules:

- `capability`: does a build have a vision tower (config ``vision_config`` AND tower weights)?
- `images`: open and validate a picture (missing, not an image, damaged, huge, animated) into a `PreparedImage`.
- `dataurl`: pictures sent over the API (``data:`` URLs, base64); remote URLs refused.
- `cost`: the tower's weight bytes and one image's activation memory, for the fit.
- `runner`: the mlx-vlm side of a chat: the tower loaded next to mlx-lm's text model (sharing its weights),
  a turn's pictures encoded once into embeddings and mRoPE positions, fed through mlx-lm's own generation loop.
"""
