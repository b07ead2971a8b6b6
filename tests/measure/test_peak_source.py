"""Which readings a run's peak may come from (measure/peak_source.py), through the session and
into the sweep's rows."""

from __future__ import annotations

from peakmem.jobs.runner import JobSpec
from peakmem.measure.fake_probe import FakeProbe
from peakmem.measure.groundtruth import done_keys, row_from_result
from peakmem.measure.peak_source import resolve_peak
from peakmem.measure.session import MeasureOptions, measure_job
from tests.measure import fakejob_state

MiB = 2**20
GB = 10**9


def test_a_process_listed_by_its_pid_peaks_at_its_own_largest_reading():
    # readings before NVML listed it (device-wide, or another process read as ours) came before
    # its context existed: they never set the peak
    peaks = {"nvml-device-delta": 69 * GB, "nvml-host-pid": 9 * GB, "nvml-process": 7_300 * MiB}
    peak = resolve_peak(peaks, 7_000 * MiB, "nvml-process")
    assert (peak.bytes, peak.source, peak.unknown_reason) == (7_300 * MiB, "nvml-process", "")
    assert resolve_peak({"no-context": 0}, 800 * MiB, "nvml-process").bytes == 800 * MiB


def test_a_process_never_listed_has_no_peak_beside_others():
    peak = resolve_peak({"nvml-host-pid": 5 * GB, "unknown": 0}, 5 * GB, "nvml-host-pid")
    assert (peak.bytes, peak.source) == (0, "unknown") and "never this one" in peak.unknown_reason
    peak = resolve_peak({"no-context": 0, "not-listed-yet": 0}, 0, "not-listed-yet")
    assert (peak.bytes, peak.source) == (0, "unknown") and "end of the run" in peak.unknown_reason


def test_readings_that_count_no_one_else_keep_the_largest():
    peak = resolve_peak({"no-context": 0, "nvml-device-delta": 3 * GB}, 2 * GB, "nvml-device-delta")
    assert (peak.bytes, peak.source) == (3 * GB, "nvml-device-delta")
    peak = resolve_peak({"nvml-host-pid": 4 * GB, "not-listed-yet": 0}, 5 * GB, "nvml-host-pid")
    assert (peak.bytes, peak.source) == (5 * GB, "nvml-host-pid")
    assert resolve_peak({}, 0, "no-context").bytes == 0  # a job that never used CUDA


# the probe reads a neighbour's 69 GB device-wide during start-up, then the process itself
STARTUP_JOB = """
import time
from tests.measure import fakejob_state
probe = fakejob_state.PROBE
probe.source = fakejob_state.FIRST
probe.set_used(69 * 10**9)
time.sleep(0.05)
probe.source = fakejob_state.THEN
probe.set_used(7_300 * 2**20, reserved=6_500 * 2**20)
time.sleep(0.05)
probe.set_used(7_000 * 2**20, reserved=6_500 * 2**20)
"""


def measure_startup(write_script, first: str, then: str):
    probe = FakeProbe(source="no-context")
    fakejob_state.PROBE, fakejob_state.FIRST, fakejob_state.THEN = probe, first, then
    try:
        options = MeasureOptions(steps=None, sample_hz=500)
        return measure_job(JobSpec(script=str(write_script(STARTUP_JOB))), probe, options)
    finally:
        fakejob_state.PROBE = None


def test_the_session_takes_the_peak_from_the_process_own_readings(write_script):
    result = measure_startup(write_script, "nvml-device-delta", "nvml-process")
    assert (result.peak_bytes, result.peak_source) == (7_300 * MiB, "nvml-process")
    assert result.context_bytes == 500 * MiB and result.peak_unknown == ""


def test_an_unknown_peak_becomes_an_error_row_the_sweep_measures_again(write_script):
    result = measure_startup(write_script, "unknown", "unknown")
    assert result.status == "ok" and result.peak_source == "unknown"
    assert (result.peak_bytes, result.context_bytes) == (0, 0) and result.peak_unknown
    row = row_from_result(result.to_json(), job="a.py", args="--batch-size 8", gpu="h200",
                          config="a.py", sweep="s")  # fmt: skip
    assert row["status"] == "error" and row["error"].startswith("peak unknown: NVML listed")
    assert row["measured_peak_bytes"] == "" and row["context_bytes"] == ""
    row.update(steps=3, alloc_conf="")
    failed = {**row, "args": "--batch-size 16", "error": "ValueError", "peak_source": ""}
    # a job's own error stays done unless errors are retried; an unknown peak is always retried
    assert {k.args for k in done_keys([row, failed])} == {"--batch-size 16"}
