"""benchmarks/xmem_reruns.py: xMem's verification reruns read back from its stored error
(|ground2 - estimate| / ground, exp/run.py `format_old_json_data`), and which caps bind."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from peakmem.datasets.rows import BenchRow

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "xmem_reruns.py"
MIB = 2**20


@pytest.fixture(scope="module")
def reruns():
    spec = importlib.util.spec_from_file_location("xmem_reruns", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def _row(measured_mib: float, total_mib: float) -> BenchRow:
    return BenchRow(
        id="00000", dataset="xmem", family="m", job={"model": "m", "batch_size": 1,
                                                    "optimizer": "SGD"},
        measured_peak_bytes=int(measured_mib * MIB), status="ok", gpu="rtx3060-12gb",
        torch_version="2.6.0", gpu_total_bytes=int(total_mib * MIB), features={},
    )


def _line(estimate: float, error: float, oom: str = "False") -> dict[str, str]:
    return {"estimate_mib": str(estimate), "second_run_rel_error": str(error),
            "second_run_oom": oom}


def test_the_cap_is_the_fraction_xmem_rounds_to_two_places(reruns):
    assert reruns.cap_mib(3600.0, 12000.0) == pytest.approx(0.30 * 12000.0)
    assert reruns.cap_mib(20000.0, 12000.0) == pytest.approx(12000.0)  # at most the whole GPU


def test_the_rerun_is_the_estimate_less_the_error_times_the_first_peak(reruns):
    # error = |ground2 - estimate| / ground: a rerun at 2600 MiB against an estimate of 3600
    error = (3600.0 - 2600.0) / 3000.0
    assert reruns.second_run(3600.0, error, 3000.0) == pytest.approx(2600.0)


def test_reruns_keep_the_ones_that_ran_and_say_which_caps_bind(reruns):
    row = _row(3000.0, total_mib=12000.0)
    found = reruns.reruns(row, {
        "SchedTune": _line(3600.0, (3600.0 - 2600.0) / 3000.0),  # cap 3600: above 3000
        "DNNMem": _line(2500.0, (2500.0 - 2490.0) / 3000.0),     # cap 2520: below 3000
        "LLMem": _line(1800.0, 0.4, oom="True"),                 # the rerun ran out of memory
        "xMem": {"estimate_mib": "", "second_run_rel_error": "", "second_run_oom": "False"},
    })
    by_name = {r.estimator: r for r in found}
    assert set(by_name) == {"SchedTune", "DNNMem"}
    assert not by_name["SchedTune"].binds(3000.0, 100.0)
    assert by_name["DNNMem"].binds(3000.0, 100.0)
    assert by_name["SchedTune"].measured_mib == pytest.approx(2600.0)
    assert by_name["DNNMem"].measured_mib == pytest.approx(2490.0)
