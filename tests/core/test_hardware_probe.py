"""The hardware probe for real: on an Apple Silicon Mac (the Mac CI job) against sysctl/ioreg/Metal themselves,
elsewhere the off-Mac path. The recorded-output parsers are tested on every platform in test_hardware.py."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from macapp.core import hardware
from macapp.devtools.probe import probe_report

on_apple_silicon = sys.platform == "darwin" and platform.machine() == "arm64"
mac_only = pytest.mark.skipif(not on_apple_silicon, reason="Apple Silicon macOS only: real sysctl, ioreg and Metal")
off_mac_only = pytest.mark.skipif(on_apple_silicon, reason="off Apple Silicon only: the probe's fallback path")


@mac_only
def test_the_real_probe_reads_chip_memory_gpu_cores_and_metal_budget():
    machine = hardware.detect_machine()
    print(json.dumps(probe_report(), indent=2))  # into the CI log (pytest -s) and the probe step's log
    brand = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True).stdout
    memsize = int(subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True, text=True).stdout)
    assert machine.is_apple_silicon and machine.family and machine.chip.startswith("Apple M")
    assert machine.family in brand
    assert machine.memory_bytes == memsize
    assert machine.gpu_cores and machine.gpu_cores >= 7
    assert machine.budget_source == "mlx" and 0.5 * memsize < machine.budget_bytes <= memsize
    assert machine.bandwidth_gbs and machine.bandwidth_gbs > 50


@off_mac_only
def test_off_a_mac_the_probe_uses_the_budget_rule():
    report = probe_report()
    assert report["is_apple_silicon"] is False and report["source"] == "not-apple"
    assert report["budget_source"] == "rule"
    assert report["budget_bytes"] == hardware.budget_by_rule(report["memory_bytes"])


def test_the_probe_command_prints_one_json_object():
    result = subprocess.run([sys.executable, "-m", "macapp.devtools.probe"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["memory_bytes"] > 0 and 0 < report["budget_bytes"] <= report["memory_bytes"]
