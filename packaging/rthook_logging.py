"""PyInstaller runtime hook: the bundled app writes its log file from the first moment, whatever the entry does.

A windowed app has no terminal, so the log (<app home>/logs/qwen-desk.log) is where a crash's trace ends up.
setup_logging() is idempotent: the CLI calling it again changes nothing. A broken log folder never stops the app.
"""

try:
    from macapp.core.logs import setup_logging

    setup_logging()
except Exception as exc:  # noqa: BLE001 - report and start anyway
    import sys

    print(f"qwen-desk: cannot open the log file: {exc}", file=sys.stderr)
