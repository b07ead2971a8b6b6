"""`nn.DataParallel` over several fake GPUs (capture/data_parallel.py): each device's allocations
in a trace of its own, sized by torch's rules (scatter's chunks, replicate's coalesced broadcast,
gather, the gradients' coalesced reduce), the estimate the largest device's.

The bytes below are worked out from the shapes: chunk(N) of a batch of B rows gives ceil(B/N)
rows per chunk (the last smaller, fewer chunks when B < N); device 0's chunk of a device batch is
a view, the others are copies; the parameters (and buffers, per dtype) are flattened per 10 MiB
bucket on device 0 (no copy for a one-tensor bucket) and copied to each other device as one
block; the outputs are gathered into one tensor on device 0; in backward each device flattens its
gradients per bucket and device 0 receives their sum in one new block (the gradients are its
views)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from peakmem.capture import capture_callable
from peakmem.capture.data_parallel import BUFFER_SIZE, _take_tensors, visible_device_count
from peakmem.estimate import estimate
from peakmem.profiles import load_gpu, load_stack
from peakmem.trace.events import EventKind
from tests.capture.capture_helpers import live_at_end

FP32 = 4
SCRIPTS = Path(__file__).resolve().parents[1] / "library_jobs" / "scripts"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gpus(monkeypatch):
    def visible(count: int) -> None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(count))))

    return visible


def _capture(job, steps=1):
    result = capture_callable(job, gpu=load_gpu("a100-40gb"), stack=load_stack("2.4.1"),
                              steps=steps)
    assert result.error is None, result.error_text
    return result


def _allocs(trace, op=None, phase=None):
    """The sizes of the trace's allocations (of an op / phase), in order."""
    sizes = []
    for kind, _ident, size, _stream, tag_id in trace.events():
        if kind != EventKind.ALLOC:
            continue
        tag = trace.tags[tag_id]
        if (op is None or tag.op == op) and (phase is None or tag.phase == phase):
            sizes.append(size)
    return sizes


def _mlp():
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))


MLP_PARAMS = (256 * 64 + 256 + 8 * 256 + 8) * FP32  # 74784: one bucket


def _train_mlp(batch):
    def job():
        model = nn.DataParallel(_mlp().cuda())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(batch, 64).cuda()
        model(x).sum().backward()
        optimizer.step()

    return job


def test_the_job_sees_the_visible_devices(gpus):
    assert visible_device_count({}) == 1
    assert visible_device_count({"CUDA_VISIBLE_DEVICES": "0"}) == 1
    assert visible_device_count({"CUDA_VISIBLE_DEVICES": "3,1,2"}) == 3
    gpus(4)
    seen = {}

    def job():
        seen["count"] = torch.cuda.device_count()
        model = nn.DataParallel(_mlp().cuda())
        seen["ids"] = model.device_ids

    from torch.nn.parallel import comm

    before = (comm.broadcast_coalesced, comm.scatter, nn.DataParallel.parallel_apply,
              torch.cuda.device_count)
    _capture(job)
    assert seen == {"count": 4, "ids": [0, 1, 2, 3]}
    # the fakes are undone after the capture
    assert (comm.broadcast_coalesced, comm.scatter, nn.DataParallel.parallel_apply,
            torch.cuda.device_count) == before


def test_mlp_over_two_gpus_uneven_batch(gpus):
    gpus(2)
    result = _capture(_train_mlp(7))
    assert sorted(result.device_traces) == [1]
    zero, one = result.trace, result.device_traces[1]
    # chunk(2) of 7 rows: 4 (a view on device 0) and 3 (copied to device 1)
    # forward: device 1 gets its chunk and the parameters' one bucket
    assert _allocs(one, "clone.default", "forward") == [3 * 64 * FP32, MLP_PARAMS]
    assert _categories(one, "clone.default")[:2] == ["input", "parameter"]  # the replica's
    # device 0 flattened the bucket to broadcast it (freed at once), gathered the 7 x 8 output
    assert _allocs(zero, "cat.default", "forward") == [MLP_PARAMS, 7 * 8 * FP32]
    # each replica's activations are its chunk's: 4 rows on device 0, 3 on device 1
    assert _allocs(zero, "relu.default") == [4 * 256 * FP32]
    assert _allocs(one, "relu.default") == [3 * 256 * FP32]
    # backward: the output's gradient scattered (device 1's 3 x 8 rows copied), each device
    # flattens its gradients, device 0 receives their sum in one block (the gradients' storage)
    assert _allocs(one, "clone.default", "backward") == [3 * 8 * FP32]
    assert _allocs(one, "cat.default", "backward") == [MLP_PARAMS]
    assert _allocs(zero, "cat.default", "backward") == [MLP_PARAMS]
    assert _allocs(zero, "empty_like.default", "backward") == [MLP_PARAMS]
    assert zero.tags[zero.tag_ids[_alloc_index(zero, "empty_like.default")]].category == "gradient"
    # no gradient of a replica ever lands on device 1 for good: all its memory is freed
    assert _live_at_end(one) == 0


def _categories(trace, op):
    """The categories of the trace's allocations by `op`, in order."""
    return [trace.tags[tag_id].category for kind, _i, _s, _st, tag_id in trace.events()
            if kind == EventKind.ALLOC and trace.tags[tag_id].op == op]


def _alloc_index(trace, op):
    for index, (kind, _i, _s, _st, tag_id) in enumerate(trace.events()):
        if kind == EventKind.ALLOC and trace.tags[tag_id].op == op:
            return index
    raise AssertionError(op)


def _live_at_end(trace):
    return sum(size for size in live_at_end(trace) if size != 8519680)  # cuBLAS workspaces


def test_cnn_with_batchnorm_over_four_gpus(gpus):
    gpus(4)

    def job():
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)).cuda()
        model = nn.DataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x, y = torch.randn(10, 3, 16, 16).cuda(), torch.randint(0, 10, (10,)).cuda()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    result = _capture(job)
    assert sorted(result.device_traces) == [1, 2, 3]
    params = (8 * 3 * 3 * 3 + 8 + 8 + 8 + 10 * 8 + 10) * FP32  # conv, BN affine, linear: 1320
    # buffers: num_batches_tracked (int64: a bucket of its own, one tensor: copied as it is,
    # first by dtype number) and running_mean and running_var (fp32, one bucket of 2 x 32 B)
    row = 3 * 16 * 16 * FP32
    # chunk(4) of 10 rows: 3, 3, 3, 1
    for device, rows in ((1, 3), (2, 3), (3, 1)):
        trace = result.device_traces[device]
        assert _allocs(trace, "clone.default", "forward") == [rows * row, params, 8, 2 * 8 * FP32]
        assert _categories(trace, "clone.default")[:4] == ["input", "parameter", "buffer", "buffer"]
        assert _allocs(trace, "relu.default") == [rows * 8 * 16 * 16 * FP32]
    assert _allocs(result.trace, "relu.default") == [3 * 8 * 16 * 16 * FP32]
    # device 0 flattened the parameters and the two fp32 buffers; not the lone int64 buffer
    assert _allocs(result.trace, "cat.default", "forward") == [params, 2 * 8 * FP32, 10 * 10 * FP32]


def test_buckets_follow_cpp_take_tensors(gpus):
    big = torch.empty(2048, 2048)  # 16 MiB: reaches the 10 MiB limit alone
    small = [torch.empty(2048), torch.empty(8, 2048), torch.empty(8)]
    assert _take_tensors([big, *small], BUFFER_SIZE) == [[0], [1, 2, 3]]
    assert _take_tensors([*small, big], BUFFER_SIZE) == [[0, 1, 2, 3]]  # closed by the big one
    ints = torch.empty(4, dtype=torch.int64)
    # the open buckets by dtype number (int64 before float32)
    assert _take_tensors([small[0], ints, small[1]], BUFFER_SIZE) == [[1], [0, 2]]
    gpus(2)

    def job():
        model = nn.DataParallel(nn.Sequential(nn.Linear(2048, 2048), nn.Linear(2048, 8)).cuda())
        model(torch.randn(4, 2048).cuda())

    result = _capture(job, steps=None)
    rest = (2048 + 8 * 2048 + 8) * FP32
    # device 1: its 2 rows, the 16 MiB weight as it is, then the other three in one block
    assert _allocs(result.device_traces[1], "clone.default") == [2 * 2048 * FP32, 2048 * 2048 * FP32,
                                                                 rest]
    # device 0 flattened only the three-tensor bucket
    assert _allocs(result.trace, "cat.default")[:1] == [rest]


def test_the_estimate_is_the_largest_device(gpus):
    gpus(2)
    mib = 1 << 20

    def job():  # no parameters; the output gathered on device 1
        model = nn.DataParallel(nn.ReLU(), output_device=1)
        out = model(torch.randn(64 * mib // FP32).view(64, -1).cuda())
        out.sum()

    est = estimate(job, gpu="a100-40gb", torch_version="2.4.1", mode="fake")
    devices = est.to_json()["devices"]
    assert [report["device"] for report in devices] == [0, 1]
    # device 0: the 64 MiB batch + its 32 MiB relu chunk; device 1: its 32 MiB copy, its relu
    # chunk, the gathered 64 MiB output
    assert devices[0]["peak_allocated_bytes"] == 96 * mib
    assert devices[1]["peak_allocated_bytes"] == 128 * mib
    assert est.peak_bytes == devices[1]["peak_bytes"] > devices[0]["peak_bytes"]
    assert est.to_json()["peak_bytes"] == devices[1]["peak_bytes"]
    assert any("more than cuda:0's" in note for note in est.notes)


def test_one_gpu_is_unchanged(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    est = estimate(_train_mlp(7), gpu="a100-40gb", torch_version="2.4.1", mode="fake")
    assert est.capture.devices == [] and est.capture.device_traces == {}
    (only,) = est.to_json()["devices"]
    assert only["device"] == 0 and only["peak_bytes"] == est.peak_bytes == est.device_peak_bytes
    assert not any("nn.DataParallel" in note for note in est.notes)


def test_kuangliu_style_script_through_the_cli(tmp_path):
    """`if torch.cuda.device_count() > 1: net = nn.DataParallel(net)`, the GPUs given by the
    command's CUDA_VISIBLE_DEVICES."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run(
        [sys.executable, "-m", "peakmem", "estimate", "--json", "--gpu", "h100-80gb", "--",
         "env", "CUDA_VISIBLE_DEVICES=0,1,2,3", sys.executable,
         str(SCRIPTS / "kuangliu_cifar_dataparallel.py")],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout)
    assert "Let's use 4 GPUs" in done.stderr
    devices = data["devices"]
    assert [report["device"] for report in devices] == [0, 1, 2, 3]
    # the peak is in a step after the first (momentum buffers live; the gradients were set to
    # None by zero_grad and not yet reduced)
    assert {"parameter", "buffer", "optimizer_state"} <= set(devices[0]["breakdown"])
    # the other GPUs hold the replica's broadcast blocks (parameters, BatchNorm buffers), never
    # a gradient or optimizer state of their own
    params = (16 * 3 * 9 + 16 + 2 * 16 + 32 * 16 * 9 + 32 + 2 * 32 + 10 * 32 + 10) * 4
    for report in devices[1:]:
        assert not {"gradient", "optimizer_state"} & set(report["breakdown"])
        assert report["breakdown"]["parameter"] == -(-params // 512) * 512
    assert data["peak_bytes"] == max(report["peak_bytes"] for report in devices)
    # batches of 10 rows: 3, 3, 3 and 1 per device
    assert devices[1]["peak_allocated_bytes"] == devices[2]["peak_allocated_bytes"]
    assert devices[3]["peak_allocated_bytes"] < devices[1]["peak_allocated_bytes"]


def test_functional_data_parallel_and_the_gradient_values_in_eager_mode(gpus):
    """`nn.parallel.data_parallel(module, input, device_ids)` runs the same way; in eager mode
    the reduced gradients are the sum of the replicas' (the values are real)."""
    gpus(2)
    seen = {}

    def job():
        torch.manual_seed(0)
        model = nn.Linear(4, 1, bias=False).cuda()
        x = torch.arange(12.0).view(3, 4).cuda()
        out = nn.parallel.data_parallel(model, x, device_ids=[0, 1])
        out.sum().backward()
        seen["grad"] = model.weight.grad.cpu()
        seen["shape"] = tuple(out.shape)

    result = capture_callable(job, gpu=load_gpu("a100-40gb"), stack=load_stack("2.4.1"),
                              mode="eager")
    assert result.error is None, result.error_text
    assert seen["shape"] == (3, 1)
    # d(sum(x @ w.T))/dw = the column sums of x, whichever replica each row ran on
    assert seen["grad"].tolist() == [[12.0, 15.0, 18.0, 21.0]]
    # device 1 ran the last row (chunk(2) of 3 rows: 2 + 1) with its copy of the weight, and
    # got the last row of the output's gradient in backward (the functional form runs outside
    # any module's forward: the copies are made between phases)
    assert _allocs(result.device_traces[1], "clone.default") == [4 * FP32, 4 * FP32, 1 * FP32]
