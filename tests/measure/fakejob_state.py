"""Shared state between a test and the fake job script it runs in-process."""

from __future__ import annotations

from peakmem.measure.fake_probe import FakeProbe

PROBE: FakeProbe | None = None
FIRST = ""  # sources the fake start-up job of test_peak_source.py reads with
THEN = ""
