from __future__ import annotations

import csv
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import workspace_table as wt  # noqa: E402

MiB = 2**20


def ev(action, addr, size, frames=None):
    event = {"action": action, "addr": addr, "size": size, "stream": 0}
    if frames is not None:
        event["frames"] = [{"name": n, "filename": "", "line": 0} for n in frames]
    return event


WINDOWED = {
    "meta": {"gpu": "fake"},
    "windows": [
        {   # conv forward: output stays, two workspaces (one overlapping the other)
            "op": "conv2d", "direction": "forward", "shape": "32x64x56x56->64 k3 s1",
            "dtype": "float32", "benchmark": False, "call": 1, "library": "cudnn",
            "events": [
                ev("alloc", 0x1000, 100 * MiB),            # output
                ev("alloc", 0x9000, 40 * MiB),             # workspace 1
                ev("alloc", 0xA000, 8 * MiB),              # workspace 2, while 1 is alive
                ev("free_requested", 0xA000, 8 * MiB),
                ev("free_completed", 0xA000, 8 * MiB),
                ev("free_requested", 0x9000, 40 * MiB),
                ev("free_completed", 0x9000, 40 * MiB),
                ev("alloc", 0x9000, 4 * MiB),              # address reused: a third temporary
                ev("free_requested", 0x9000, 4 * MiB),
                ev("free_completed", 0x9000, 4 * MiB),
                ev("segment_alloc", 0x9000, 40 * MiB),
            ],
        },
        {   # nothing temporary
            "op": "linear", "direction": "forward", "shape": "4x4->4", "dtype": "bfloat16",
            "benchmark": False, "call": 2, "library": "cublas",
            "events": [ev("alloc", 0x2000, 512)],
        },
    ],
}  # fmt: skip


def test_temporaries_peak_and_outputs():
    sizes, peak, output = wt.temporaries(WINDOWED["windows"][0]["events"])
    assert sorted(sizes) == [4 * MiB, 8 * MiB, 40 * MiB]
    assert peak == 48 * MiB and output == 100 * MiB


def test_temporaries_old_free_action():
    sizes, peak, output = wt.temporaries([ev("alloc", 1, 10), ev("free", 1, 10), ev("alloc", 2, 5)])
    assert sizes == [10] and peak == 10 and output == 5


def test_windowed_rows():
    rows = wt.extract(WINDOWED, "probe.pickle")
    conv, linear = rows
    assert (conv.op, conv.direction, conv.count, conv.max_bytes) == (
        "conv2d",
        "forward",
        3,
        40 * MiB,
    )
    assert conv.sizes == f"{40 * MiB};{8 * MiB};{4 * MiB}"
    assert conv.peak_concurrent_bytes == 48 * MiB and conv.benchmark == "False"
    assert (linear.count, linear.max_bytes, linear.output_bytes) == (0, 0, 512)


def test_plain_snapshot_attribution_by_frames():
    snapshot = {"segments": [], "device_traces": [[
        ev("alloc", 1, 64 * MiB, ["c10::cuda::CUDACachingAllocator::malloc",
                                  "at::native::raw_cudnn_convolution_forward_out",
                                  "cudnnBackendExecute"]),
        ev("alloc", 2, 32 * MiB, ["at::cuda::getCUDABlasLtWorkspace", "at::native::addmm_out_cuda"]),
        ev("alloc", 3, 1 * MiB, ["at::native::_efficient_attention_forward"]),
        ev("alloc", 4, 2 * MiB, ["at::native::add"]),             # not a library allocation
        ev("alloc", 5, 16 * MiB, ["at::native::raw_cudnn_convolution_forward_out", "cudnn"]),
    ]]}  # fmt: skip
    rows = {(r.library, r.op): r for r in wt.extract(snapshot, "s.pickle")}
    assert set(rows) == {("cudnn", "raw_cudnn_convolution_forward_out"),
                         ("cublaslt", "addmm_out_cuda"),
                         ("sdpa-efficient", "_efficient_attention_forward")}  # fmt: skip
    cudnn = rows[("cudnn", "raw_cudnn_convolution_forward_out")]
    assert cudnn.count == 2 and cudnn.max_bytes == 64 * MiB


def test_extract_rejects_other_pickles():
    with pytest.raises(ValueError):
        wt.extract({"x": 1}, "bad")


def test_cli_writes_table(tmp_path):
    src = tmp_path / "w.pickle"
    src.write_bytes(pickle.dumps(WINDOWED))
    out = tmp_path / "t.csv"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "workspace_table.py"),
                           str(src), "--out", str(out)], capture_output=True, text=True,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 2 and rows[0]["max_bytes"] == str(40 * MiB)
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"not a pickle")
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "workspace_table.py"),
                           str(bad), "--out", str(out)], capture_output=True, text=True,
                          check=False)  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith("workspace_table:")


def test_probe_without_gpu_one_line():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "workspace_probe.py")],
                          capture_output=True, text=True, check=False,
                          env={"PYTHONPATH": str(REPO / "src"), "PATH": ""})  # fmt: skip
    assert done.returncode == 1 and done.stderr.strip() == "workspace_probe: no CUDA GPU"
