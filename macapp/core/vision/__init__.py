"""Images through mlx-vlm: which builds see, reading pictures safely, and the tower itself (what pictures cost in
memory is the fit's: macapp.core.fit.picture_cost).

Below the runtime (macapp.core.engine), which runs pictures in chat turns (engine/pictures.py) and over the
local API (macapp.core.serving.pictures); nothing here knows either, nor the history. UI-free, and mlx-vlm is
imported only when a picture is actually run (`runner`), so starting the app and text-only chats never pay for
it. Modules:

- `capability`: does a build have a vision tower (config ``vision_config`` AND tower weights)?
- `images`: open and validate a picture (missing, not an image, damaged, huge, animated) into a `PreparedImage`.
- `dataurl`: pictures sent over the API (``data:`` URLs, base64); remote URLs refused.
- `pictures`: pictures kept for the history (content-addressed PNG files); `refs`: their `ImageRef`
  (plain data, macapp.core.picture_data).
- `tower`: the tower as a capability of one loaded model (LoadedModel.tower), attached on first use.
- `runner`: the mlx-vlm side of a chat: the tower loaded next to mlx-lm's text model (sharing its weights),
  a turn's pictures encoded once into embeddings and mRoPE positions, fed through mlx-lm's own generation loop.
- `spans`: `PictureSpan`, where a turn's pictures put the mRoPE positions in a prompt cache (no MLX import: the
  engine's positions and prompt cache keep them).
"""
