"""Print what the hardware probe finds on this machine, as JSON: `python -m macapp.devtools.probe`.

The Mac CI job runs it so the real sysctl / ioreg / Metal-budget readings are in its log; on a user's Mac it is
the quickest way to see what the fit check assumes.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import sys

from macapp.core.hardware import detect_machine


def probe_report() -> dict[str, object]:
    machine = detect_machine()
    return {
        "platform": f"{platform.system()} {platform.machine()}",
        "python": sys.version.split()[0],
        **dataclasses.asdict(machine),
        "is_apple_silicon": machine.is_apple_silicon,
    }


def main() -> int:
    print(json.dumps(probe_report(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
