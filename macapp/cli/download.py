"""`qwen-desk download MODEL`: fetch an MLX build into the Hugging Face cache, resumable and verified.

Also `qwen-desk download --list` (what is in the cache) and `qwen-desk download --delete MODEL`; `--mtp` then
fetches the MTP head the build lacks from the original Qwen repo (macapp/core/hub/mtp_fetch.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TextIO

from macapp.cli import Subparsers, UsageError
from macapp.core import catalog
from macapp.core import download as dl
from macapp.core.fit.estimate import mtp_words
from macapp.core.hub.mtp import MtpStatus, MtpWhere, folder_status, hub_status, source_repo_for
from macapp.core.hub.mtp_fetch import fetch_mtp_head, plan_mtp_fetch
from macapp.core.hub.record import record_for
from macapp.core.jsonvalue import JSONObject
from macapp.core.memory import format_bytes  # decimal units (GB = 1e9), like `qwen-desk fit` and the window


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "download",
        help="download a model into the Hugging Face cache (resumable, verified)",
        description="Download an MLX build into the Hugging Face cache (HF_HOME). Interrupted downloads resume "
        "where they stopped; every file is checked against the hub's sha256 before the model is ready.",
    )
    parser.add_argument("model", nargs="?", help="catalog name (Qwen3.5-35B-A3B), hub repo id, or local folder")
    parser.add_argument("--bits", type=int, choices=(4, 8), help="MLX build (default 4 for catalog names)")
    parser.add_argument("--revision", default="main", help="branch, tag or commit (default main)")
    parser.add_argument("--json", action="store_true", help="print a JSON object on stdout at the end")
    parser.add_argument("--dry-run", action="store_true", help="show what would be fetched and whether it fits, then stop")
    parser.add_argument("--list", action="store_true", help="list the models in the Hugging Face cache with their sizes")
    parser.add_argument("--delete", action="store_true", help="remove MODEL from the Hugging Face cache")
    parser.add_argument(
        "--mtp",
        action="store_true",
        help="also get the MTP head (for speculative decoding) when the build lacks it: only its tensors, "
        "by range requests on the original repo, quantized like the build",
    )
    parser.add_argument(
        "--mtp-from", metavar="REPO", help="the original repo to take the MTP head from (default: the catalog's, or the build card's base_model)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.list:
        return _list(args)
    if not args.model:
        raise UsageError("name a model to download, e.g. `qwen-desk download Qwen3.5-0.8B` (or use --list)")
    repo, model = _resolve(args.model, args.bits)
    if repo is None:
        if args.delete:
            raise UsageError(f"{args.model} is a local folder, not a download; delete it yourself if you mean to")
        _say(args, f"{args.model} is a local folder: nothing to download")
        if args.json:
            print(
                json.dumps(
                    {
                        "repo": None,
                        "path": str(model.local_path),
                        "bytes_total": model.weights_bytes or 0,
                        "bytes_downloaded_this_run": 0,
                        "files": [],
                        "verified": False,
                    },
                    indent=2,
                )
            )
        return 0
    if args.delete:
        return _delete(args, repo)
    return _download(args, repo, model)


def _resolve(spec: str, bits: int | None) -> tuple[str | None, catalog.ModelRef]:
    try:
        model = catalog.resolve_model(spec, bits)
    except (catalog.UnknownModel, catalog.ConfigError) as exc:
        raise UsageError(str(exc)) from None
    return model.repo, model


def _say(args: argparse.Namespace, text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _download(args: argparse.Namespace, repo: str, model: catalog.ModelRef) -> int:
    command = "qwen-desk download " + shlex.quote(args.model) + (f" --bits {args.bits}" if args.bits else "")
    view = _ProgressView(sys.stderr)
    try:
        plan = dl.plan_download(repo, args.revision, model=model)
        _say(args, _describe_plan(plan))
        if args.dry_run:
            mtp = _mtp_dry_run(args, repo, plan) if args.mtp else None
            if args.json:
                print(json.dumps({**_plan_json(plan), **({"mtp": mtp} if args.mtp else {})}, indent=2))
            return 0 if plan.disk_ok else 1
        cancel = dl.CancelToken()
        with _ctrl_c_cancels(cancel):
            result = dl.download(plan, on_event=view.on_event, cancel=cancel)
    except dl.DownloadCancelled as exc:
        view.close()
        kept = exc.bytes_kept
        _say(args, f"stopped; {format_bytes(kept)} kept. Run `{command}` again to resume.")
        if args.json:
            print(json.dumps({"repo": repo, "ready": False, "error": {"kind": exc.kind, "message": str(exc)}}, indent=2))
        return 130
    except dl.DownloadError as exc:
        view.close()
        _say(args, f"qwen-desk: {exc}")
        if exc.kind in (dl.DownloadErrorKind.NETWORK, dl.DownloadErrorKind.SERVER, dl.DownloadErrorKind.DISK_FULL) and exc.bytes_kept:
            _say(args, f"{format_bytes(exc.bytes_kept)} kept; `{command}` resumes from there.")
        if args.json:
            print(json.dumps({"repo": repo, "ready": False, "error": {"kind": exc.kind, "message": str(exc)}}, indent=2))
        return 1
    view.close()
    fetched = result.bytes_downloaded_this_run
    _say(
        args,
        f"ready: {repo} ({format_bytes(result.bytes_total)}, {len(result.files)} files, hashes checked; {format_bytes(fetched)} fetched now) in {result.path}",
    )
    extra: dict[str, object] = {}
    if args.mtp:
        try:
            extra["mtp"] = _fetch_mtp(args, repo, result.path)
        except dl.DownloadError as exc:
            _say(args, f"qwen-desk: MTP head: {exc}")
            if exc.bytes_kept and exc.kind is not dl.DownloadErrorKind.CANCELLED:
                _say(args, f"{format_bytes(exc.bytes_kept)} of the head kept; `{command} --mtp` resumes from there.")
            if args.json:
                print(json.dumps({**result.to_json(), "ready": True, "mtp": {"ready": False, "error": {"kind": exc.kind, "message": str(exc)}}}, indent=2))
            return 130 if isinstance(exc, dl.DownloadCancelled) else 1
    if args.json:
        print(json.dumps({**result.to_json(), "ready": True, **extra}, indent=2))
    return 0


@contextlib.contextmanager
def _ctrl_c_cancels(cancel: dl.CancelToken) -> Iterator[None]:
    """Ctrl-C cancels the download (it stops within about a second, keeping what it has) instead of raising
    KeyboardInterrupt wherever the main thread happens to be: inside concurrent.futures' wait, that can leave a
    future's lock held and a worker unable to finish, so the process never exits. A second Ctrl-C interrupts."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_ctrl_c(_signum: int, _frame: FrameType | None) -> None:
        cancel.cancel()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _fetch_mtp(args: argparse.Namespace, repo: str, folder: Path) -> dict[str, object]:
    """The MTP head for the downloaded build in `folder`: kept where it is, or fetched now. Returns its JSON."""
    status = folder_status(folder, repo)
    if status.usable:
        _say(
            args,
            f"MTP head: {'in the build' if status.where is MtpWhere.IN_BUILD else 'fetched already'} ({format_bytes(status.head_bytes)}); nothing to fetch",
        )
        return {"ready": True, **status.to_json()}
    plan = plan_mtp_fetch(folder, repo, source_repo=args.mtp_from)
    _say(
        args,
        f"MTP head: {format_bytes(plan.fetch_bytes)} to fetch from {plan.source_repo} @ {plan.commit[:10]} "
        f"({len(plan.tensors)} mtp.* tensors in {len(plan.ranges)} byte ranges), about {format_bytes(plan.head_bytes)} "
        f"once quantized like the build",
    )
    progress = _MtpProgress(sys.stderr)
    try:
        fetched = fetch_mtp_head(plan, on_progress=progress.update)
    except KeyboardInterrupt:
        raise dl.DownloadCancelled(
            f"MTP fetch of {plan.source_repo} interrupted; run it again to resume",
            repo=plan.source_repo,
            bytes_kept=plan.part_path.stat().st_size if plan.part_path.exists() else 0,
        ) from None
    finally:
        progress.close()
    _say(
        args,
        f"MTP head ready: {fetched.tensors} tensors, {format_bytes(fetched.head_bytes)} in {fetched.side_file} "
        f"({format_bytes(fetched.bytes_fetched_this_run)} fetched now)",
    )
    return {"ready": True, "where": "fetched", **fetched.to_json()}


def _mtp_dry_run(args: argparse.Namespace, repo: str, plan: dl.DownloadPlan) -> JSONObject:
    """What --mtp would do, from the hub records (the build's and the original's headers, no tensor data)."""
    try:
        if plan.complete:
            status = folder_status(plan.snapshot_path, repo)
            if not status.usable:
                fetch = plan_mtp_fetch(plan.snapshot_path, repo, source_repo=args.mtp_from)
                status = MtpStatus(MtpWhere.TO_FETCH, fetch.head_bytes, fetch.fetch_bytes, fetch.source_repo)
        else:
            build = record_for(repo)
            source = args.mtp_from or source_repo_for(repo) or build.base_model or None
            status = hub_status(build, record_for(source) if source else None)
    except dl.DownloadError as exc:
        _say(args, f"  MTP head: {exc}")
        return {"where": "unknown", "error": {"kind": exc.kind, "message": str(exc)}}
    except Exception as exc:  # a dry run reports; it never fails for the head
        _say(args, f"  MTP head: cannot tell ({type(exc).__name__}: {exc})")
        return {"where": "unknown", "error": {"kind": "error", "message": str(exc)}}
    _say(args, "  " + mtp_words(status))
    return status.to_json()


class _MtpProgress:
    """The head's fetch: a line redrawn in place on a terminal, a plain line every few seconds otherwise."""

    def __init__(self, stream: TextIO, plain_every_s: float = 5.0) -> None:
        self.stream = stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.plain_every_s = plain_every_s
        self.last = 0.0
        self.drawn = False

    def update(self, done: int, total: int) -> None:
        text = f"MTP head: {done / total if total else 1:4.0%} {format_bytes(done)} of {format_bytes(total)}"
        if self.tty:
            self.stream.write("\r" + text + "\x1b[K")
            self.stream.flush()
            self.drawn = True
        elif time.monotonic() - self.last >= self.plain_every_s or done == total:
            self.last = time.monotonic()
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False


def _describe_plan(plan: dl.DownloadPlan) -> str:
    lines = [f"{plan.repo} @ {plan.commit[:10]}: {len(plan.files)} files, {format_bytes(plan.bytes_total)}"]
    if plan.ready:
        lines.append("  already downloaded and verified")
    elif plan.complete:
        lines.append("  already downloaded, not yet verified: a download checks the hashes of the files on disk; nothing is fetched")
    else:
        here = plan.bytes_on_disk
        lines.append(
            f"  to fetch: {format_bytes(plan.bytes_to_fetch)}"
            + (f" ({format_bytes(here)} already here)" if here else "")
            + f"; free on disk: {format_bytes(plan.disk_free)}"
        )
        if not plan.disk_ok:
            lines.append("  " + plan.disk_message())
    if plan.fit is not None:
        fit = plan.fit
        verdict = {"fits": "fits", "tight": "tight", "too_big": "too big"}.get(fit.verdict, fit.verdict)
        lines.append(f"  on this machine: {verdict} ({format_bytes(fit.total_bytes)} of a {format_bytes(fit.budget_bytes)} budget at {fit.context} tokens)")
    if plan.from_cache_only:
        lines.append("  (hub not asked: offline, or unreachable; using the cached listing)")
    return "\n".join(lines)


def _plan_json(plan: dl.DownloadPlan) -> dict[str, object]:
    return {
        "repo": plan.repo,
        "revision": plan.revision,
        "commit": plan.commit,
        "path": str(plan.snapshot_path),
        "bytes_total": plan.bytes_total,
        "bytes_on_disk": plan.bytes_on_disk,
        "bytes_to_fetch": plan.bytes_to_fetch,
        "disk_free": plan.disk_free,
        "disk_ok": plan.disk_ok,
        "ready": plan.ready,
        "files": [{"path": f.remote.path, "size": f.remote.size, "sha256": f.remote.sha256, "state": f.state} for f in plan.files],
        "fit": plan.fit.verdict if plan.fit is not None else None,
    }


def _list(args: argparse.Namespace) -> int:
    models = dl.list_downloaded()
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "repo": m.repo,
                        "path": str(m.path) if m.path else None,
                        "bytes_on_disk": m.bytes_on_disk,
                        "bytes_total": m.bytes_total,
                        "complete": m.complete,
                        "verified": m.verified,
                        "partial_bytes": m.partial_bytes,
                    }
                    for m in models
                ],
                indent=2,
            )
        )
        return 0
    if not models:
        print(f"no models in {dl.hub_cache_dir()}")
        return 0
    for m in models:
        if m.ready:
            state = "ready"
        elif m.complete:
            # Usable (mlx-lm loads it), but no one here has checked its hashes: nothing checks them on load.
            state = f"complete, not yet verified: run `qwen-desk download {m.repo}` to verify"
        elif m.bytes_total:
            state = f"partial {min(m.bytes_on_disk, m.bytes_total) / m.bytes_total:.0%} (resumable)"
        else:
            state = "partial (resumable)"
        print(f"{m.repo:55s} {format_bytes(m.bytes_on_disk):>9s}  {state}")
    return 0


def _delete(args: argparse.Namespace, repo: str) -> int:
    try:
        freed = dl.delete_model(repo)
    except dl.DownloadError as exc:
        _say(args, f"qwen-desk: {exc}")
        return 1
    if args.json:
        print(json.dumps({"repo": repo, "deleted": freed > 0, "bytes_freed": freed}))
    else:
        print(f"deleted {repo} ({format_bytes(freed)} freed)" if freed else f"{repo} was not in the cache")
    return 0


class _ProgressView:
    """A one-line bar redrawn in place on a terminal; plain lines (at most every few seconds) otherwise."""

    def __init__(self, stream: TextIO, plain_every_s: float = 5.0) -> None:
        self.stream = stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.plain_every_s = plain_every_s
        self.last_plain = 0.0
        self.states: dict[str, str] = {}
        self.drawn = False
        self.printed_full = False

    def on_event(self, event: dl.DownloadEvent) -> None:
        match event:
            case dl.Progress():
                self._progress(event)
            case dl.Stalled(seconds=seconds):
                self._line(f"stalled: no data for {seconds:.0f} s (the transfer is retried if it stays dead)")
            case dl.Retrying():
                self._line(f"retrying {event.path} in {event.delay_s:.0f} s (attempt {event.attempt}/{event.max_attempts}): {event.reason}")
            case dl.Notice(message=message):
                self._line(message)

    def _progress(self, p: dl.Progress) -> None:
        for f in p.files:
            if self.states.get(f.path) != f.state and f.state in (dl.FileState.READY, dl.FileState.FAILED) and f.path in self.states:
                self._line(f"{f.state}: {f.path} ({format_bytes(f.size)})")
            self.states[f.path] = f.state
        ready = sum(1 for f in p.files if f.state == dl.FileState.READY)
        speed = "stalled" if p.stalled else f"{format_bytes(p.speed_bps):>8s}/s"
        eta = _clock(p.eta_s) if p.eta_s is not None and not p.stalled else "--:--"
        text = f"{p.fraction:4.0%} {format_bytes(p.bytes_done)} of {format_bytes(p.bytes_total)}  {speed}  ETA {eta}  {ready}/{len(p.files)} files"
        if self.tty:
            width = 24
            fill = int(width * p.fraction)
            self.stream.write("\r[" + "#" * fill + "." * (width - fill) + "] " + text + "\x1b[K")
            self.stream.flush()
            self.drawn = True
        else:
            now = time.monotonic()
            done = p.fraction >= 1.0
            if (now - self.last_plain >= self.plain_every_s and not done) or (done and not self.printed_full):
                self.last_plain = now
                self.printed_full = done
                print(text, file=self.stream, flush=True)

    def _line(self, text: str) -> None:
        if self.tty and self.drawn:
            self.stream.write("\r\x1b[K")
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:d}:{s:02d}"
