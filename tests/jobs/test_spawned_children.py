"""Child interpreters the job starts through multiprocessing's spawn / forkserver start methods
run under the fake GPU (capture/spawned_children.py): each is a process of its own on the GPU
(its CUDA context, libraries and allocator), reported in the estimate's `processes` and added
to `peak_bytes`; children that use no device memory add nothing. Before, a spawn child re-ran
the script's top-level CUDA code as `__mp_main__` on the CPU-only torch and failed the job.

The estimates run concurrently (one module fixture starts them all): each needs a job process
and its children's interpreters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from peakmem.capture import spawned_children
from peakmem.capture.result_io import ResultFormatError, decode, encode
from peakmem.capture.spawned_children import booted_args, read_reports, valid_report

SRC = Path(__file__).resolve().parents[2] / "src"
MIB, GIB = 1 << 20, 1 << 30

TRAIN = """import torch
model = torch.nn.Linear(16, 16).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(4, 16, device="cuda")).sum().backward()
    opt.step(); opt.zero_grad()
"""

SCRIPTS = {
    # the k7 sweep's case: the child re-imports the script (top-level CUDA code) as __mp_main__
    "spawn_top_level": TRAIN + """import multiprocessing as mp
def f():
    pass
if __name__ == "__main__":
    mp.set_start_method("spawn")
    p = mp.Process(target=f)
    p.start(); p.join()
    assert p.exitcode == 0, p.exitcode
""",
    # a child whose target allocates device memory itself
    "spawn_allocates": """import torch, multiprocessing as mp
def f(n):
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    assert x.is_cuda and torch.cuda.memory_allocated() == n
if __name__ == "__main__":
    keep = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    p = mp.get_context("spawn").Process(target=f, args=(1 << 30,))
    p.start(); p.join()
    assert p.exitcode == 0, p.exitcode
""",
    "forkserver": """import torch, multiprocessing as mp
def f(n):
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
if __name__ == "__main__":
    model = torch.nn.Linear(16, 16).cuda()
    p = mp.get_context("forkserver").Process(target=f, args=(1 << 30,))
    p.start(); p.join()
    assert p.exitcode == 0, p.exitcode
""",
    # `with Pool(...)` ends its workers with SIGTERM (Pool.terminate): they report first
    "pool_map": """import torch, multiprocessing as mp
def f(n):
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    return int(x.numel())
if __name__ == "__main__":
    model = torch.nn.Linear(16, 16).cuda()
    with mp.get_context("spawn").Pool(2) as pool:
        assert pool.map(f, [1 << 20, 2 << 20]) == [1 << 20, 2 << 20]
""",
    # host-only workers: no device memory, nothing added
    "process_pool_executor": """import torch, multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
def f(n):
    return n * 2
if __name__ == "__main__":
    model = torch.nn.Linear(16, 16).cuda()
    with ProcessPoolExecutor(2, mp_context=mp.get_context("spawn")) as ex:
        assert list(ex.map(f, [1, 2, 3])) == [2, 4, 6]
""",
    "dataloader_spawn": """import torch
from torch.utils.data import DataLoader, TensorDataset
if __name__ == "__main__":
    model = torch.nn.Linear(16, 16).cuda()
    loader = DataLoader(TensorDataset(torch.randn(64, 16)), batch_size=8, num_workers=2,
                        multiprocessing_context="spawn")
    for (x,) in loader:
        model(x.cuda()).sum().backward()
""",
    # children left running at the end: python's shutdown terminates the daemonic one and joins
    # the other; the job's own process never touches the GPU
    "left_running": """import torch, multiprocessing as mp, time
def f(n, ready):
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    ready.set()
    time.sleep(600)
def g(n):
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    ctx.Process(target=f, args=(1 << 30, ready), daemon=True).start()
    ctx.Process(target=g, args=(1 << 29,)).start()
    assert ready.wait(300)
""",
    # the job's time limit ends its spawn children with it (one process group)
    "timeout": """import sys, time, multiprocessing as mp
def f():
    time.sleep(600)
if __name__ == "__main__":
    p = mp.get_context("spawn").Process(target=f)
    p.start()
    print(f"CHILD_PID={p.pid}", file=sys.stderr, flush=True)
    p.join()
""",
}


def _start(name: str, root: Path) -> tuple[subprocess.Popen, Path]:
    case = root / name
    case.mkdir()
    (case / "train.py").write_text(SCRIPTS[name])
    timeout = ["--timeout", "40"] if name == "timeout" else []
    env = {**os.environ, "PYTHONPATH": str(SRC), "PEAKMEM_WARM": "0"}
    process = subprocess.Popen(
        [sys.executable, "-m", "peakmem", "estimate", "--gpu", "h200", "--json", *timeout, "--",
         "python", "train.py"],
        cwd=case, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL)
    return process, case


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[int, dict, str, Path]]:
    """All of SCRIPTS' estimates at once: the module's one slow setup (~110 s in a CI run at
    load 2-4), and it stays slow. Eight cold job interpreters and ten more that the jobs start
    (spawn children, pool workers, a forkserver), each booted under the capture with torch
    imported: what this module tests. Only `timeout` waits out a limit (40 s, beside the
    others): the job's own cold start and its child's spawn must come first, half a minute on
    a loaded machine."""
    root = tmp_path_factory.mktemp("spawned")
    started = {name: _start(name, root) for name in SCRIPTS}
    done = {}
    for name, (process, case) in started.items():
        out, err = process.communicate(timeout=600)
        done[name] = (process.returncode, json.loads(out) if out.strip() else {}, err, case)
    return done


def _own(data: dict) -> int:
    return data["context_bytes"] + data["library_bytes"] + data["peak_reserved_bytes"]


def test_a_spawn_child_reruns_the_scripts_top_level_cuda_code_on_the_fake_gpu(runs):
    code, data, err, _ = runs["spawn_top_level"]
    assert code == 0, err[-3000:]
    (child,) = data["processes"]
    assert (child["method"], child["exit_code"], child["device"]) == ("spawn", 0, True)
    # the same top-level training ran in both processes: the same allocations
    assert child["peak_allocated_bytes"] == data["peak_allocated_bytes"]
    assert child["peak_reserved_bytes"] == data["peak_reserved_bytes"]
    assert child["peak_bytes"] == child["context_bytes"] + child["library_bytes"] + child[
        "peak_reserved_bytes"]
    assert child["context_bytes"] == data["context_bytes"]  # a context of its own
    assert data["processes_bytes"] == child["peak_bytes"]
    assert data["peak_bytes"] == _own(data) + child["peak_bytes"]
    assert any("CUDA contexts of their own" in note for note in data["notes"])


def test_a_spawn_child_that_allocates_is_its_own_process_on_the_gpu(runs):
    code, data, err, _ = runs["spawn_allocates"]
    assert code == 0, err[-3000:]
    (child,) = data["processes"]
    # the child's 1 GiB is its own allocator's (its memory_allocated() saw only it); the job's
    # own process holds its 256 MiB
    assert (child["peak_allocated_bytes"], child["peak_reserved_bytes"]) == (GIB, GIB)
    assert data["peak_allocated_bytes"] == 256 * MIB
    assert data["peak_bytes"] == _own(data) + child["peak_bytes"]
    assert child["peak_bytes"] == child["context_bytes"] + child["library_bytes"] + GIB


def test_a_forkserver_child_runs_on_the_fake_gpu(runs):
    code, data, err, _ = runs["forkserver"]
    assert code == 0, err[-3000:]
    (child,) = data["processes"]
    assert (child["method"], child["exit_code"]) == ("forkserver", 0)
    assert (child["peak_allocated_bytes"], child["peak_reserved_bytes"]) == (GIB, GIB)
    assert data["peak_bytes"] == _own(data) + child["peak_bytes"]


def test_pool_workers_ended_by_terminate_report_what_they_ran(runs):
    code, data, err, _ = runs["pool_map"]
    assert code == 0, err[-3000:]
    workers = data["processes"]
    # SIGTERM (or a worker that took the pool's end-of-work sentinel first, as on a GPU)
    assert 1 <= len(workers) <= 2 and all(w["exit_code"] in (0, -15) for w in workers), workers
    # whichever worker ran the 2 MiB task: it was its largest allocation (each task's tensor is
    # freed when the task returns); 2 MiB is a large block: one 20 MiB segment (kLargeBuffer)
    busiest = max(workers, key=lambda w: w["peak_allocated_bytes"])
    assert busiest["peak_allocated_bytes"] == 2 * MIB, workers
    assert busiest["peak_reserved_bytes"] >= 20 * MIB
    assert data["processes_bytes"] == sum(w["peak_bytes"] for w in workers if w["device"])
    assert data["peak_bytes"] == _own(data) + data["processes_bytes"]


def test_host_only_workers_add_nothing(runs):
    code, data, err, _ = runs["process_pool_executor"]
    assert code == 0, err[-3000:]
    assert len(data["processes"]) == 2
    assert not any(w["device"] for w in data["processes"])
    assert data["processes_bytes"] == 0 and data["peak_bytes"] == _own(data)
    assert any("made no device allocations: they add nothing" in n for n in data["notes"])


def test_a_spawn_dataloader_works_and_counts_no_device_memory(runs):
    code, data, err, _ = runs["dataloader_spawn"]
    assert code == 0, err[-3000:]
    assert data["processes"] == [] and data["processes_bytes"] == 0
    assert data["peak_bytes"] == _own(data)
    assert any("num_workers=2 loaded its batches in the main process" in n for n in data["notes"])


def test_children_left_running_end_as_at_pythons_shutdown_and_report(runs):
    code, data, err, _ = runs["left_running"]
    assert code == 0, err[-3000:]
    # the two reports in any order (pids and start times race under load): the daemon was
    # terminated at shutdown, the other joined
    daemon, other = sorted(data["processes"], key=lambda w: w["exit_code"])
    assert (daemon["exit_code"], daemon["peak_allocated_bytes"]) == (-15, GIB)  # terminated
    assert (other["exit_code"], other["peak_allocated_bytes"]) == (0, GIB // 2)  # joined
    # no context of the job's own: on the GPU its process never initialised CUDA
    assert (data["context_bytes"], data["library_bytes"], data["peak_reserved_bytes"]) == (0, 0, 0)
    assert data["peak_bytes"] == data["processes_bytes"] == daemon["peak_bytes"] + other[
        "peak_bytes"]
    assert any("its own CUDA context is not counted" in note for note in data["notes"])
    assert not any(note.startswith("WARNING: the job made no device") for note in data["notes"])


def test_the_time_limit_ends_the_spawn_child_too(runs):
    code, data, err, _ = runs["timeout"]
    assert code == 124, err[-3000:]
    (pid,) = [int(line.split("=")[1]) for line in err.splitlines()
              if line.startswith("CHILD_PID=")]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.2)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# -- the pieces, without a job ------------------------------------------------------------------


@pytest.fixture
def configured(tmp_path):
    spawned_children.configure(tmp_path, "h200", "2.4.1", "fake")
    yield tmp_path
    spawned_children._CONFIG.clear()


def test_the_bootstrap_goes_before_spawn_and_forkserver_programs_only(configured):
    spawn = ["python", "-B", "-c", "from multiprocessing.spawn import spawn_main; "
             "spawn_main(tracker_fd=5, pipe_handle=7)", "--multiprocessing-fork"]
    booted = booted_args(spawn)
    assert booted[:3] == spawn[:3] and booted[4:] == spawn[4:]
    assert booted[3].endswith(spawn[3]) and "spawned_children import boot" in booted[3]
    server = ["python", "-c", "from multiprocessing.forkserver import main; main(3, 4, [])"]
    assert '"method": "forkserver"' in booted_args(server)[2]
    tracker = ["python", "-c", "from multiprocessing.resource_tracker import main;main(7)"]
    assert booted_args(tracker) == tracker
    spawned_children._CONFIG.clear()
    assert booted_args(spawn) == spawn  # outside a job's process: unchanged


def _report(**change) -> dict:
    report = {"pid": 7, "parent": 1, "name": "Process-1", "method": "spawn", "start": 1.0,
              "end": 2.0, "steps": 0, "fake_limit": None, "exit_code": 0, "device": True,
              "peak_bytes": 3, "context_bytes": 1, "library_bytes": 1, "peak_reserved_bytes": 1,
              "peak_allocated_bytes": 1, "error": None}
    report.update(change)
    return report


def test_malformed_reports_are_left_out(tmp_path):
    (tmp_path / "spawned-7.json").write_text(json.dumps(_report()))
    (tmp_path / "spawned-8.json").write_text(json.dumps(_report(pid=8, peak_bytes=-1)))
    (tmp_path / "spawned-9.json").write_text(json.dumps(_report(pid=9, extra=1)))
    (tmp_path / "spawned-10.json").write_text("{not json")
    (tmp_path / "spawned-11.json").symlink_to(tmp_path / "spawned-7.json")
    assert read_reports(tmp_path) == [_report()]
    assert not valid_report(_report(device=1)) and not valid_report(_report(method="fork"))
    assert not valid_report(_report(start=float("nan"))) and not valid_report(_report(end=1))


def test_the_result_file_checks_the_processes_field():
    from tests.jobs.test_result_io import sample

    result = sample()
    result.processes = [_report()]
    fields, _, _ = decode(encode(result, pid=1))
    assert fields["processes"] == [_report()]
    result.processes = [_report(peak_bytes="many")]
    with pytest.raises(ResultFormatError):
        decode(encode(result, pid=1))
