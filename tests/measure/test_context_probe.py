from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from peakmem.measure.fake_probe import FakeProbe

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import context_probe  # noqa: E402


class _FakeCuda:
    @staticmethod
    def memory_allocated() -> int:
        return 123


class _FakeTorch:
    cuda = _FakeCuda


def test_run_stages_records_outside_allocator():
    probe = FakeProbe()

    def ctx(torch, keep):
        probe.set_used(500, reserved=0)

    def mm(torch, keep):
        keep["a"] = 1
        probe.set_used(800 + 2048, reserved=2048)

    records = context_probe.run_stages(probe, _FakeTorch, {"context": ctx, "matmul": mm})
    assert [r["stage"] for r in records] == ["context", "matmul"]
    assert records[0]["outside_allocator_bytes"] == 500
    assert records[1]["outside_allocator_bytes"] == 800
    assert records[1]["allocated_bytes"] == 123


def test_stage_registry():
    assert list(context_probe.STAGES)[:3] == ["context", "first_kernel", "matmul_fp32"]
    assert {"conv_forward", "sdpa_backward"} <= set(context_probe.STAGES)


def test_without_gpu_one_line_error():
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "context_probe.py"), "--modes", "LAZY"],
        capture_output=True, text=True, env={"PYTHONPATH": str(REPO / "src"), "PATH": ""},
        check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith("context_probe: no CUDA GPU")
