"""Are the model files the same on every host? A fingerprint of a model folder, cheap enough to take anywhere.

It hashes config.json, the weight index and every safetensors file's size and header (names, dtypes, shapes and
offsets of every tensor), not the weights themselves (hundreds of GB): a different build, conversion,
quantization or a truncated download changes it; two different sets of numbers with the same layout do not.

    python -m macapp.core.cluster.fingerprint MODEL    # prints the JSON the launcher compares (run over ssh)
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from macapp.core.engine import EngineError, locate_model
from macapp.core.modelfiles import read_safetensors_header

PLAIN_FILES = ("config.json", "model.safetensors.index.json")


@dataclass(frozen=True)
class Fingerprint:
    files: dict[str, str]  # file name -> sha256 of what was compared

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.files, sort_keys=True).encode()).hexdigest()

    def differences(self, other: "Fingerprint") -> list[str]:
        """The files that differ (or exist on one side only), sorted."""
        names = set(self.files) | set(other.files)
        return sorted(n for n in names if self.files.get(n) != other.files.get(n))


def fingerprint(folder: Path) -> Fingerprint:
    """The fingerprint of a model folder; OSError / ValueError for files that cannot be read."""
    files: dict[str, str] = {}
    for name in PLAIN_FILES:
        path = folder / name
        if path.is_file():
            files[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    for path in sorted(folder.glob("*.safetensors")):
        header = read_safetensors_header(path)
        with open(path, "rb") as f:
            raw = f.read(header.header_bytes)
        files[path.name] = hashlib.sha256(raw + str(path.stat().st_size).encode()).hexdigest()
    return Fingerprint(files)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m macapp.core.cluster.fingerprint MODEL", file=sys.stderr)
        return 2
    try:
        folder = locate_model(args[0])
        print(json.dumps({"path": str(folder), "files": fingerprint(folder).files}))
    except EngineError as exc:
        print(json.dumps({"error": exc.message}))
        return 1
    except (OSError, ValueError) as exc:
        print(json.dumps({"error": f"cannot read the model files: {exc}"}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
