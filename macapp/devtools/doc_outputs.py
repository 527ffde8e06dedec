"""The example outputs in README.md and docs/*.md, written by the code they document (`make docs`).

A page marks each example with the command that makes it:

    <!-- output: qwen-desk fit Qwen3.5-35B-A3B --chip "M4 Max" --memory 64GB --context 20000 -->
    ```
    (whatever is here is replaced)
    ```
    <!-- /output -->

`python -m macapp.devtools.doc_outputs` runs every such command and writes `$ COMMAND` and its output between the
markers; `--check` writes nothing and lists the blocks that are out of date (tests/test_docs.py runs it). Each
command runs as `python -m macapp` in a fresh process on a throwaway app home and Hugging Face cache, offline, with
a fixed terminal width, so the output is the built-in catalog's and a "what if" Mac's, the same on every machine.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^<!-- output: (?P<command>.+?) -->\n(?P<body>.*?)^<!-- /output -->", re.DOTALL | re.MULTILINE)
PROGRAM = "qwen-desk"
COLUMNS = "100"  # argparse wraps --help at the terminal's width


class DocOutputError(Exception):
    """A marked command that cannot be run as documented."""


@dataclass(frozen=True)
class StaleBlock:
    page: Path
    command: str


def pages(root: Path = ROOT) -> list[Path]:
    """The pages that may carry marked outputs: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def run_command(command: str, work: Path) -> str:
    """The block a documented `qwen-desk …` command gets: the command line, then what it printed."""
    argv = shlex.split(command)
    if not argv or argv[0] != PROGRAM:
        raise DocOutputError(f"a documented output must come from `{PROGRAM} …`, not {command!r}")
    env = {
        **os.environ,
        "QWEN_DESK_HOME": str(work / "home"),
        "HF_HOME": str(work / "hf"),
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": COLUMNS,
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run([sys.executable, "-m", "macapp", *argv[1:]], capture_output=True, text=True, env=env, cwd=work, timeout=120)
    if done.returncode != 0:
        raise DocOutputError(f"`{command}` exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return f"```\n$ {command}\n{done.stdout.rstrip()}\n```\n"


def render(text: str, outputs: dict[str, str]) -> str:
    """The page with every marked block holding its command's output."""
    return BLOCK.sub(lambda match: f"<!-- output: {match['command']} -->\n{outputs[match['command']]}<!-- /output -->", text)


def commands(texts: list[str]) -> list[str]:
    """Every marked command once, in page order."""
    return list(dict.fromkeys(match["command"] for text in texts for match in BLOCK.finditer(text)))


def regenerate(files: list[Path], write: bool) -> list[StaleBlock]:
    """Run the marked commands (two at a time) and bring the pages up to date, or only say which blocks are not."""
    texts = {page: page.read_text() for page in files}
    wanted = commands(list(texts.values()))
    with tempfile.TemporaryDirectory(prefix="qwen-desk-docs-") as work, ThreadPoolExecutor(max_workers=2) as pool:
        outputs = dict(zip(wanted, pool.map(lambda command: run_command(command, Path(work)), wanted)))
    stale = []
    for page, text in texts.items():
        for match in BLOCK.finditer(text):
            if match["body"] != outputs[match["command"]]:
                stale.append(StaleBlock(page, match["command"]))
        if write and (fresh := render(text, outputs)) != text:
            page.write_text(fresh)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m macapp.devtools.doc_outputs", description="The example outputs in README.md and docs/*.md, written by the code they document."
    )
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a documented output is out of date")
    parser.add_argument("files", nargs="*", type=Path, help="pages to update (default: README.md and docs/*.md)")
    args = parser.parse_args(argv)
    try:
        stale = regenerate(args.files or pages(), write=not args.check)
    except DocOutputError as exc:
        print(f"doc_outputs: {exc}", file=sys.stderr)
        return 2
    for block in stale:
        print(
            f"{'out of date' if args.check else 'updated'}: {block.page.relative_to(ROOT) if block.page.is_relative_to(ROOT) else block.page}: {block.command}"
        )
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
