"""RESUME after a reboot keeps one run clock (issue 22): the monotonic clock restarts at boot, so
a recorded monotonic origin from another boot would put new records before the old ones."""

from __future__ import annotations

import pytest

from compaction_bench.bench.run.resume import clock_fields, resumed_origin

STARTED = {"clock_origin_monotonic": 5000.0, "clock_origin_wall": 1_700_000_000.0,
           "boot_id": "boot-a"}


def test_the_same_boot_keeps_the_recorded_origin() -> None:
    assert resumed_origin(STARTED, boot="boot-a", monotonic_now=9000.0,
                          wall_now=1_700_004_000.0) == 5000.0


def test_after_a_reboot_the_run_clock_keeps_counting_wall_time() -> None:
    # rebooted: the monotonic clock reads 30 s, an hour of wall time after the run started
    origin = resumed_origin(STARTED, boot="boot-b", monotonic_now=30.0,
                            wall_now=1_700_003_600.0)
    assert 30.0 - origin == pytest.approx(3600.0)  # now is t = 3600 s on the run clock
    # with the recorded origin, now would read t = -4970 s, before the run began
    assert 30.0 - STARTED["clock_origin_monotonic"] < 0


def test_older_manifests_and_systems_without_a_boot_id_keep_the_recorded_origin() -> None:
    old = {"clock_origin_monotonic": 5000.0}
    assert resumed_origin(old, boot="boot-b", monotonic_now=30.0, wall_now=0.0) == 5000.0
    assert resumed_origin(STARTED, boot=None, monotonic_now=30.0, wall_now=0.0) == 5000.0


def test_a_new_manifest_records_its_boot_and_wall_origin() -> None:
    fields = clock_fields(123.0)
    assert fields["clock_origin_monotonic"] == 123.0
    assert isinstance(fields["clock_origin_wall"], float)
    assert fields["boot_id"] is None or isinstance(fields["boot_id"], str)
