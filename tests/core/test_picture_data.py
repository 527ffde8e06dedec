"""Pictures as plain data (macapp.core.picture_data): one ImageRef for the history, one ImagePart for requests, the
same records under the names the front ends know them by."""

import pytest

from macapp.core.picture_data import ImagePart, ImageRef, refs_from_json, refs_to_json

SHA = "ab" * 32


def test_refs_go_to_json_and_back_and_unreadable_ones_are_dropped():
    refs = (ImageRef(SHA, "cat.png", 64, 48), ImageRef("cd" * 32, "pasted picture", 1, 2))
    assert refs_from_json(refs_to_json(refs)) == refs
    assert refs[0].file_name == f"{SHA}.png"
    mixed = '[{"sha256": "%s", "name": "a.png", "width": 3, "height": 4}, {"sha256": "nope"}, 7]' % SHA
    assert refs_from_json(mixed) == (ImageRef(SHA, "a.png", 3, 4),)
    assert refs_from_json("not json") == () and refs_from_json(None) == ()
    with pytest.raises(ValueError, match="not a picture reference"):
        ImageRef.from_dict({"sha256": "../../etc/passwd"})


def test_the_old_names_are_the_same_records():
    from macapp.core.serving.requests import ImagePart as RequestImagePart
    from macapp.core.vision.refs import ImageRef as VisionImageRef

    assert RequestImagePart is ImagePart and VisionImageRef is ImageRef
    assert ImagePart(b"\x89PNG").media_type == ""
