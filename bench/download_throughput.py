"""Downloads against the local hub stand-in (run by hand: `python bench/download_throughput.py`).

- fresh download throughput: ours (Range transfer + sha256 of every file) vs huggingface_hub.snapshot_download;
- what a resume after kill -9 at half of a shard costs: bytes fetched again by the second run, ours vs
  huggingface_hub (which restarts the file from byte 0 in a new process).

Loopback HTTP on a shared 2-core VM: the absolute MB/s say little about a real network, the ratios and the
re-fetched bytes are the point.
"""

from __future__ import annotations

import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from tests.fixtures.hub import HubStandIn  # noqa: E402

REPO = "bench/Tiny-Bench-4bit"
SHARDS = 4
SHARD_BYTES = 48 * 1024**2
MB = 1024**2


def repo_files() -> dict[str, bytes]:
    rng = random.Random(7)
    files = {f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors": rng.randbytes(SHARD_BYTES) for i in range(SHARDS)}
    files["config.json"] = b'{"model_type": "qwen3_5"}'
    files["tokenizer.json"] = b'{"version": "1.0"}'
    return files


def fresh_home() -> str:
    home = tempfile.mkdtemp(prefix="dl-bench-")
    os.environ["HF_HOME"] = home
    return home


def ours(hub: HubStandIn) -> float:
    from macapp.core.download import download

    home = fresh_home()
    t = time.perf_counter()
    download(REPO)
    elapsed = time.perf_counter() - t
    shutil.rmtree(home)
    return elapsed


def theirs(hub: HubStandIn) -> float:
    from huggingface_hub import snapshot_download

    home = fresh_home()
    t = time.perf_counter()
    snapshot_download(REPO, endpoint=hub.url, cache_dir=os.path.join(home, "hub"))
    elapsed = time.perf_counter() - t
    shutil.rmtree(home)
    return elapsed


def resume_cost(hub: HubStandIn, code: str, part_glob: str, others: list[str]) -> int:
    """Kill -9 a download once half of shard 1 is on disk; return the bytes the next run fetches."""
    home = fresh_home()
    shard = "model-00001-of-00004.safetensors"
    half = SHARD_BYTES // 2
    hub.clear_faults()
    hub.stall(shard, after=half, seconds=60)
    blobs = Path(home) / "hub" / "models--bench--Tiny-Bench-4bit" / "blobs"
    env = dict(os.environ, HF_ENDPOINT=hub.url)
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        parts = list(blobs.glob(part_glob)) if blobs.is_dir() else []
        # huggingface_hub writes in 10 MB chunks: wait for the last whole chunk before the stall, and for the
        # other shards to be complete, so both tools are killed in the same state.
        if parts and max(p.stat().st_size for p in parts) >= (half // (10 * MB)) * 10 * MB and all((blobs / name).exists() for name in others):
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    hub.clear_faults()
    before = hub.bytes_served()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    fetched = hub.bytes_served() - before
    shutil.rmtree(home)
    return fetched


def main() -> None:
    hub = HubStandIn().start()
    files = repo_files()
    hub.add_repo(REPO, files)
    os.environ["HF_ENDPOINT"] = hub.url
    total = sum(len(v) for v in files.values())
    print(f"download throughput — {platform.node() or 'vm'} {platform.machine()} — {date.today()}")
    print(f"repo: {SHARDS} x {SHARD_BYTES // MB} MB shards ({total / MB:.0f} MB), loopback HTTP\n")
    ours(hub)  # warm imports
    a = min(ours(hub) for _ in range(3))
    b = min(theirs(hub) for _ in range(3))
    print(f"fresh, ours (incl. sha256 of every file):  {a:6.2f} s  {total / MB / a:7.1f} MB/s")
    print(f"fresh, snapshot_download:                  {b:6.2f} s  {total / MB / b:7.1f} MB/s")
    print(f"ratio ours/snapshot_download time: {a / b:.2f}\n")
    ours_code = f"from macapp.core.download import download; download({REPO!r})"
    hf_code = (
        f"import os; from huggingface_hub import snapshot_download; "
        f"snapshot_download({REPO!r}, endpoint=os.environ['HF_ENDPOINT'], "
        f"cache_dir=os.path.join(os.environ['HF_HOME'], 'hub'))"
    )
    import hashlib

    others = [hashlib.sha256(data).hexdigest() for name, data in files.items() if name.endswith(".safetensors") and not name.startswith("model-00001")]
    ours_again = resume_cost(hub, ours_code, "*.incomplete", others)
    hf_again = resume_cost(hub, hf_code, "*.incomplete", others)
    print("after kill -9 at half of shard 1 (24 MB on disk), the next run fetched:")
    print(f"  ours:                {ours_again / MB:7.1f} MB")
    print(f"  snapshot_download:   {hf_again / MB:7.1f} MB")
    hub.stop()


if __name__ == "__main__":
    main()
