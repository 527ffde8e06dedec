"""The details pane says, for a build too big for this Mac, how many such Macs it needs (macapp.core.fit.cluster)."""

from macapp.core import hardware
from macapp.core.fit.cluster import hosts_needed


def test_too_big_build_says_how_many_such_macs_hold_it(library):
    machine = hardware.what_if_machine("M4 Max", 128 * 1024**3)
    library.set_machine(machine)
    row = library.select("Qwen3.5-397B-A17B-8bit")
    details = library.details
    assert row.estimate.verdict == "too_big"
    needed = hosts_needed(row.ref, library.context, machine, library.kv_bits)
    assert needed and needed > 1
    assert not details.cluster_note.isHidden()
    assert f"{needed} of them" in details.cluster_note.text() and f"--hosts {needed}" in details.cluster_note.text()


def test_a_build_that_fits_says_nothing_about_several_macs(library):
    library.set_machine(hardware.what_if_machine("M4 Max", 128 * 1024**3))
    row = library.select("Qwen3.5-9B-4bit")
    assert row.estimate.verdict != "too_big"
    assert library.details.cluster_note.isHidden()
