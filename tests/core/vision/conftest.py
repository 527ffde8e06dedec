from tests.fixtures.vision import picture, tiny_vlm_moe_path, tiny_vlm_path, tiny_vlm_text_only_path  # noqa: F401  (fixtures)
