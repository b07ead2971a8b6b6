"""Python processes the job starts itself (`subprocess.run([sys.executable, "train.py"])`,
`Popen(["python3", ...])`, `os.system("python ...")`, `os.execv(sys.executable, ...)`) run under
the fake GPU (capture/python_subprocesses.py, capture/subprocess_child.py): each reports its
own device memory and when it was alive, and `peak_bytes` is the most the processes alive
together hold (children run one after another do not add up). Before, they ran on this
machine's CPU-only torch: a wrapper that launched its training so failed, or was estimated
without the training's memory.

The estimates run concurrently (one module fixture starts them all)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from peakmem.capture.python_subprocesses import (
    beyond_stdlib,
    booted_command,
    capture_target,
    rewritten,
)
from peakmem.capture.spawned_children import alive_together, processes_bytes, valid_report

SRC = Path(__file__).resolve().parents[2] / "src"
MIB = 1 << 20

INNER = """import sys, torch
n = int(sys.argv[1])
x = torch.empty(n << 20, dtype=torch.uint8, device="cuda")
assert torch.cuda.memory_allocated() == n << 20
print("inner", n, flush=True)
"""

SCRIPTS = {
    # a wrapper (no device use of its own) running its training three ways, one after another
    "sequential": """import os, subprocess, sys
subprocess.run([sys.executable, "inner.py", "100"], check=True)
p = subprocess.Popen(["python3", "-u", "inner.py", "300"])
assert p.wait() == 0
assert os.system("python inner.py 200 > /dev/null") == 0
version = subprocess.run([sys.executable, "--version"], capture_output=True, text=True)
print("VERSION", version.stdout.strip(), flush=True)
""",
    # the job holds 512 MiB, then two children alive together; exit codes as python's
    "concurrent": """import subprocess, sys, torch
keep = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
code = "import sys, time, torch; x = torch.empty(int(sys.argv[1]) << 20, dtype=torch.uint8, device='cuda'); time.sleep(2)"
children = [subprocess.Popen([sys.executable, "-c", code, str(n)]) for n in (100, 200)]
assert [child.wait() for child in children] == [0, 0]
assert subprocess.run([sys.executable, "-c", "import torch; sys.exit(3)"]).returncode == 1
assert subprocess.run([sys.executable, "-c", "import sys, torch; sys.exit(3)"]).returncode == 3
failed = subprocess.run([sys.executable, "inner.py"], capture_output=True, text=True)
assert failed.returncode == 1 and "IndexError" in failed.stderr, failed.stderr[-2000:]
""",
    # a re-exec after setting a variable: the same process runs the training
    "reexec": """import os, sys, torch
if os.environ.get("STAGE") != "2":
    keep = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    os.environ["STAGE"] = "2"
    os.execv(sys.executable, [sys.executable, "inner.py", "500"])
""",
}


def _start(name: str, root: Path) -> tuple[subprocess.Popen, Path]:
    case = root / name
    case.mkdir()
    (case / "train.py").write_text(SCRIPTS[name])
    (case / "inner.py").write_text(INNER)
    env = {**os.environ, "PYTHONPATH": str(SRC), "PEAKMEM_WARM": "0"}
    process = subprocess.Popen(
        [sys.executable, "-m", "peakmem", "estimate", "--gpu", "h200", "--json", "--",
         "python", "train.py"],
        cwd=case, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL)
    return process, case


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[int, dict, str]]:
    """All of SCRIPTS' estimates at once: the module's one slow setup, and it stays slow. Three
    cold job interpreters and nine Python processes the jobs start themselves (each booted
    under the capture, torch imported: what this module tests); nothing waits out a limit
    (the `concurrent` children sleep 2 s together)."""
    root = tmp_path_factory.mktemp("subprocesses")
    started = {name: _start(name, root) for name in SCRIPTS}
    done = {}
    for name, (process, _case) in started.items():
        out, err = process.communicate(timeout=900)
        done[name] = (process.returncode, json.loads(out) if out.strip() else {}, err)
    return done


def _own(report: dict) -> int:
    return report["context_bytes"] + report["library_bytes"] + report["peak_reserved_bytes"]


def test_sequential_children_run_on_the_fake_gpu_and_do_not_add_up(runs):
    code, data, err = runs["sequential"]
    assert code == 0, err[-3000:]
    children = data["processes"]
    assert [child["name"] for child in children] == [
        "python inner.py 100", "python inner.py 300", "python inner.py 200"]
    assert all(child["method"] == "subprocess" and child["exit_code"] == 0 for child in children)
    # each its own context + libraries + what it reserved: n MiB, a large block of its own
    for child, n in zip(children, (100, 300, 200), strict=True):
        assert child["peak_allocated_bytes"] == child["peak_reserved_bytes"] == n * MIB
        assert child["peak_bytes"] == _own(child) and child["context_bytes"] > 0
    assert children[0]["end"] <= children[1]["start"] and children[1]["end"] <= children[2]["start"]
    # one after another: the largest, not the sum; the wrapper never used CUDA (no context)
    assert data["context_bytes"] == data["peak_reserved_bytes"] == 0
    assert data["peak_bytes"] == data["processes_bytes"] == children[1]["peak_bytes"]
    assert "inner 100" in err and "inner 300" in err and "inner 200" not in err  # > /dev/null
    assert "VERSION Python 3." in err  # `python --version` ran unchanged


def test_children_alive_together_add_up_with_the_job(runs):
    code, data, err = runs["concurrent"]
    assert code == 0, err[-3000:]
    first, second, *rest = data["processes"]
    assert {first["peak_allocated_bytes"], second["peak_allocated_bytes"]} == {100 * MIB, 200 * MIB}
    assert first["start"] < second["end"] and second["start"] < first["end"]
    own = data["context_bytes"] + data["library_bytes"] + data["peak_reserved_bytes"]
    assert data["peak_reserved_bytes"] == 512 * MIB
    assert data["peak_bytes"] == own + first["peak_bytes"] + second["peak_bytes"]
    assert [report["exit_code"] for report in rest] == [1, 3, 1]
    assert not rest[1]["device"] and rest[1]["peak_bytes"] == 0  # imported torch, no device use


def test_a_reexec_is_the_jobs_own_process_again(runs):
    code, data, err = runs["reexec"]
    assert code == 0, err[-3000:]
    (before,) = data["processes"]
    assert before["method"] == "exec" and before["peak_reserved_bytes"] == 64 * MIB
    # the exec'd program is the job's process now; the part before it ended at the exec
    assert data["peak_reserved_bytes"] == 500 * MIB
    own = data["context_bytes"] + data["library_bytes"] + data["peak_reserved_bytes"]
    assert data["peak_bytes"] == own and data["processes_bytes"] == 0
    assert any("replaced its process with `python inner.py 500`" in n for n in data["notes"])


# -- the pieces, without a job ------------------------------------------------------------------


def test_which_commands_are_captured():
    def target(*words):
        spec = capture_target(list(words))
        return None if spec is None else spec.command_line()

    assert target(sys.executable, "train.py", "--lr", "1") == ["python", "train.py", "--lr", "1"]
    assert target("/venv/bin/python3.11", "-u", "-m", "pkg.train") == ["python", "-m", "pkg.train"]
    assert target("python", "-c", "import torch", "a") == ["python", "-c", "import torch", "a"]
    assert target("python", "-c", "import sys, json; print(1)") is None  # the stdlib only
    assert target("python", "-m", "pip", "install", "x") is None
    assert target("python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "t.py") is None
    assert target("python", "--version") is None and target("python") is None
    assert target("python", "/site/cpuinfo/cpuinfo.py", "--json") is None
    assert target("bash", "train.py") is None and target("torchrun", "train.py") is None
    assert beyond_stdlib("from train import main; main()") and not beyond_stdlib("print(")
    # peakmem's own: a nested estimate, and the bootstraps of its job processes
    assert target("python", "-m", "peakmem", "estimate", "t.py") is None
    assert not beyond_stdlib("import sys; from peakmem.capture.child import main; main()")
    # the bootstrap decides before importing torch: `python --version` through a shim stays cheap
    probe = ("import sys; from peakmem.capture.python_subprocesses import capture_target; "
             "capture_target(['python', '--version']); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(SRC)}, check=True)
    assert out.stdout.strip() == "False"


def test_commands_are_rewritten_only_in_a_jobs_process(tmp_path, monkeypatch):
    from peakmem.capture import spawned_children

    assert rewritten([sys.executable, "train.py"]) is None  # not configured: left alone
    spawned_children.configure(tmp_path, "h200", "2.11", "fake", tmp_path / "request.json")
    try:
        booted = rewritten(["python3", "-X", "dev", "train.py", "a"])
        assert booted[0] == sys.executable and booted[1:3] == ["-X", "dev"]
        assert booted[3] == "-c" and "subprocess_child import main" in booted[4]
        assert booted[5:] == [str(tmp_path / "request.json"), "-X", "dev", "train.py", "a"]
        assert rewritten("python train.py --x 'a b'", shell=True).endswith("train.py --x 'a b'")
        assert rewritten("python train.py > log.txt", shell=True) is None  # the shim's
        assert rewritten(["nvidia-smi", "-L"]) is None
    finally:
        spawned_children._CONFIG.clear()
    assert booted_command(["python", "t.py"], "r.json")[-2:] == ["r.json", "t.py"]


def _report(pid: int, start: float, end: float, peak: int, device: bool = True) -> dict:
    return {"pid": pid, "parent": 1, "name": "p", "method": "subprocess", "start": start,
            "end": end, "steps": 0, "fake_limit": None, "exit_code": 0, "device": device,
            "peak_bytes": peak, "context_bytes": 0, "library_bytes": 0,
            "peak_reserved_bytes": peak, "peak_allocated_bytes": peak, "error": None}


def test_the_peak_is_what_the_processes_alive_together_hold():
    a, b, c = _report(1, 0.0, 10.0, 5), _report(2, 10.0, 20.0, 7), _report(3, 15.0, 30.0, 11)
    assert all(map(valid_report, (a, b, c)))
    assert not valid_report({**a, "start": 11.0})  # ends before it starts
    assert alive_together([a, b]) == 7  # one after another (b starts as a ends)
    assert alive_together([a, b, c]) == 18  # b and c together
    assert alive_together([a, b, c], own_bytes=100) == 118  # the job's process all along
    # the job's process only from 12 on (it began with an exec): a is over by then
    assert alive_together([a, b, c], 100, (12.0, 40.0)) == 118
    assert processes_bytes([a], 100, (12.0, 40.0)) == 0  # the part before the exec: not added
    assert alive_together([a, _report(4, 1.0, 2.0, 9, device=False)]) == 5


def test_a_child_stopped_by_fake_mode_makes_auto_mode_rerun_the_job(tmp_path):
    from types import SimpleNamespace

    from peakmem.capture import spawned_children

    report = {**_report(123, 1.0, 2.0, 0, device=False), "exit_code": 1,
              "parent": os.getpid(), "name": "python train.py",
              "fake_limit": "NotImplementedError: aten::foo has no meta kernel"}
    (tmp_path / "spawned-123.json").write_text(json.dumps(report))
    spawned_children.configure(tmp_path, "h200", "2.11", "fake", tmp_path / "request.json")
    try:
        failed = SimpleNamespace(error=RuntimeError("CalledProcessError"), fake_limit=None,
                                 notes=[], processes=[])
        spawned_children.attach(failed)
        ended = SimpleNamespace(error=None, fake_limit=None, notes=[], processes=[])
        spawned_children.attach(ended)
    finally:
        spawned_children._CONFIG.clear()
    assert failed.processes == [report]
    assert failed.fake_limit == ("in `python train.py`: NotImplementedError: aten::foo has no "
                                 "meta kernel")
    assert ended.fake_limit is None  # the job went on: its estimate stands
