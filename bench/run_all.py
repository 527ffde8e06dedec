"""Run every benchmark in bench/ in turn (`make bench`). Each prints its own figures; paste them into RESULTS.md."""

import subprocess
import sys
from pathlib import Path

here = Path(__file__).parent
failed = []
for script in sorted(here.glob("*.py")):
    if script.name == Path(__file__).name:
        continue
    print(f"\n=== {script.name} ===", flush=True)
    if subprocess.run([sys.executable, str(script)]).returncode != 0:
        failed.append(script.name)
sys.exit(f"failed: {', '.join(failed)}" if failed else 0)
