"""`qwen-desk download MODEL`: fetch an MLX build into the Hugging Face cache, resumable and verified.

Also `qwen-desk download --list` (what is in the cache) and `qwen-desk download --delete MODEL`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time

from macapp.cli import UsageError
from macapp.core import download as dl
from macapp.core.memory import format_bytes  # decimal units (GB = 1e9), like `qwen-desk fit` and the window


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "download", help="download a model into the Hugging Face cache (resumable, verified)",
        description="Download an MLX build into the Hugging Face cache (HF_HOME). Interrupted downloads resume "
                    "where they stopped; every file is checked against the hub's sha256 before the model is ready.")
    parser.add_argument("model", nargs="?", help="catalog name (Qwen3.5-35B-A3B), hub repo id, or local folder")
    parser.add_argument("--bits", type=int, choices=(4, 8), help="MLX build (default 4 for catalog names)")
    parser.add_argument("--revision", default="main", help="branch, tag or commit (default main)")
    parser.add_argument("--json", action="store_true", help="print a JSON object on stdout at the end")
    parser.add_argument("--dry-run", action="store_true", help="show what would be fetched and whether it fits, then stop")
    parser.add_argument("--list", action="store_true", help="list the models in the Hugging Face cache with their sizes")
    parser.add_argument("--delete", action="store_true", help="remove MODEL from the Hugging Face cache")
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
            print(json.dumps({"repo": None, "path": str(model.local_path), "bytes_total": model.weights_bytes or 0,
                              "bytes_downloaded_this_run": 0, "files": [], "verified": False}, indent=2))
        return 0
    if args.delete:
        return _delete(args, repo)
    return _download(args, repo, model)


def _resolve(spec: str, bits: int | None):
    from macapp.core import catalog

    try:
        model = catalog.resolve_model(spec, bits)
    except (catalog.UnknownModel, catalog.ConfigError) as exc:
        raise UsageError(str(exc)) from None
    return model.repo, model


def _say(args: argparse.Namespace, text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _download(args: argparse.Namespace, repo: str, model) -> int:
    command = "qwen-desk download " + shlex.quote(args.model) + (f" --bits {args.bits}" if args.bits else "")
    view = _ProgressView(sys.stderr)
    try:
        plan = dl.plan_download(repo, args.revision, model=model)
        _say(args, _describe_plan(plan))
        if args.dry_run:
            if args.json:
                print(json.dumps(_plan_json(plan), indent=2))
            return 0 if plan.disk_ok else 1
        result = dl.download(plan, on_event=view.on_event)
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
        if exc.kind in (dl.DownloadErrorKind.NETWORK, dl.DownloadErrorKind.SERVER, dl.DownloadErrorKind.DISK_FULL) \
                and exc.bytes_kept:
            _say(args, f"{format_bytes(exc.bytes_kept)} kept; `{command}` resumes from there.")
        if args.json:
            print(json.dumps({"repo": repo, "ready": False, "error": {"kind": exc.kind, "message": str(exc)}}, indent=2))
        return 1
    view.close()
    fetched = result.bytes_downloaded_this_run
    _say(args, f"ready: {repo} ({format_bytes(result.bytes_total)}, {len(result.files)} files, hashes checked; "
               f"{format_bytes(fetched)} fetched now) in {result.path}")
    if args.json:
        print(json.dumps({**result.to_json(), "ready": True}, indent=2))
    return 0


def _describe_plan(plan: dl.DownloadPlan) -> str:
    lines = [f"{plan.repo} @ {plan.commit[:10]}: {len(plan.files)} files, {format_bytes(plan.bytes_total)}"]
    if plan.ready:
        lines.append("  already downloaded and verified")
    elif plan.complete:
        lines.append("  already downloaded, not yet verified: a download checks the hashes of the files on disk; "
                     "nothing is fetched")
    else:
        here = plan.bytes_on_disk
        lines.append(f"  to fetch: {format_bytes(plan.bytes_to_fetch)}"
                     + (f" ({format_bytes(here)} already here)" if here else "")
                     + f"; free on disk: {format_bytes(plan.disk_free)}")
        if not plan.disk_ok:
            lines.append("  " + plan.disk_message())
    if plan.fit is not None:
        fit = plan.fit
        verdict = {"fits": "fits", "tight": "tight", "too_big": "too big"}.get(fit.verdict, fit.verdict)
        lines.append(f"  on this machine: {verdict} ({format_bytes(fit.total_bytes)} of a "
                     f"{format_bytes(fit.budget_bytes)} budget at {fit.context} tokens)")
    if plan.from_cache_only:
        lines.append("  (hub not asked: offline, or unreachable; using the cached listing)")
    return "\n".join(lines)


def _plan_json(plan: dl.DownloadPlan) -> dict:
    return {
        "repo": plan.repo, "revision": plan.revision, "commit": plan.commit, "path": str(plan.snapshot_path),
        "bytes_total": plan.bytes_total, "bytes_on_disk": plan.bytes_on_disk, "bytes_to_fetch": plan.bytes_to_fetch,
        "disk_free": plan.disk_free, "disk_ok": plan.disk_ok, "ready": plan.ready,
        "files": [{"path": f.remote.path, "size": f.remote.size, "sha256": f.remote.sha256, "state": f.state}
                  for f in plan.files],
        "fit": plan.fit.verdict if plan.fit is not None else None,
    }


def _list(args: argparse.Namespace) -> int:
    models = dl.list_downloaded()
    if args.json:
        print(json.dumps([{"repo": m.repo, "path": str(m.path) if m.path else None, "bytes_on_disk": m.bytes_on_disk,
                           "bytes_total": m.bytes_total, "complete": m.complete, "verified": m.verified,
                           "partial_bytes": m.partial_bytes} for m in models], indent=2))
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

    def __init__(self, stream, plain_every_s: float = 5.0) -> None:
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
                self._line(f"retrying {event.path} in {event.delay_s:.0f} s (attempt {event.attempt}/"
                           f"{event.max_attempts}): {event.reason}")
            case dl.Notice(message=message):
                self._line(message)

    def _progress(self, p: dl.Progress) -> None:
        for f in p.files:
            if self.states.get(f.path) != f.state and f.state in (dl.FileState.READY, dl.FileState.FAILED) \
                    and f.path in self.states:
                self._line(f"{f.state}: {f.path} ({format_bytes(f.size)})")
            self.states[f.path] = f.state
        ready = sum(1 for f in p.files if f.state == dl.FileState.READY)
        speed = "stalled" if p.stalled else f"{format_bytes(p.speed_bps):>8s}/s"
        eta = _clock(p.eta_s) if p.eta_s is not None and not p.stalled else "--:--"
        text = (f"{p.fraction:4.0%} {format_bytes(p.bytes_done)} of {format_bytes(p.bytes_total)}  {speed}  ETA {eta}  "
                f"{ready}/{len(p.files)} files")
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
