from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from peakmem.measure.groundtruth import (
    ALL_COLUMNS,
    COLUMNS,
    RowWriter,
    done_keys,
    profile_name,
    read_rows,
)
from peakmem.measure.sweep_plan import SweepError, load_plan, plan_from_dict
from peakmem.measure.sweep_run import run_sweep

REPO = Path(__file__).resolve().parents[2]
FAKE_WORKER = Path(__file__).with_name("fake_worker.py")


def _log(tmp_path):
    return (tmp_path / "sweep.log").open("a")


def fake_spawn(log):
    return subprocess.Popen([sys.executable, str(FAKE_WORKER)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=log, text=True)  # fmt: skip


GRID = {
    "name": "t",
    "steps": 2,
    "group": [{
        "job": "benchmarks/zoo/mlp.py", "scale": "batch-size",
        "fixed": {"device": "cuda", "grad-checkpointing": False},
        "grid": {"batch-size": [128, 8, 32], "precision": ["fp32", "bf16"],
                 "compile": [False, True]},
    }],
}  # fmt: skip


def test_plan_expansion_order_flags_and_configs():
    plan = plan_from_dict(GRID)
    assert len(plan.runs) == 12 and len(plan.configs) == 4
    first = plan.runs[:3]
    assert [r.scale for r in first] == [8, 32, 128]  # ascending within a configuration
    assert first[0].args == ("--device", "cuda", "--precision", "fp32", "--batch-size", "8")
    assert plan.runs[3].args[-3:] == ("--compile", "--batch-size", "8")
    assert first[0].config == first[2].config != plan.runs[3].config
    assert "batch-size" not in first[0].config and first[0].steps == 2


def test_plan_explicit_runs_env_and_dedup():
    plan = plan_from_dict({"run": [
        {"job": "j.py", "args": ["--a", "1"], "env": {"PYTORCH_CUDA_ALLOC_CONF": "x:1"}},
        {"job": "j.py", "args": ["--a", "1"], "env": {"PYTORCH_CUDA_ALLOC_CONF": "x:1"}},
        {"job": "j.py", "args": ["--a", "1"]},
    ]})  # fmt: skip
    assert len(plan.runs) == 2
    assert plan.runs[0].alloc_conf == "x:1" and plan.runs[1].alloc_conf == ""


@pytest.mark.parametrize("bad", [
    {}, {"group": [{"grid": {"a": [1]}}]}, {"group": [{"job": "j", "grid": {"a": []}}]},
    {"group": [{"job": "j", "scale": "b", "grid": {"a": [1]}}]}, {"run": [{"job": "j", "args": "x"}]},
])  # fmt: skip
def test_plan_rejects(bad):
    with pytest.raises(SweepError):
        plan_from_dict(bad)


@pytest.mark.parametrize("path", sorted((REPO / "benchmarks" / "sweeps").glob("*.toml")))
def test_committed_sweeps_load_and_name_real_scripts(path):
    plan = load_plan(path)
    for run in plan.runs:
        assert (REPO / run.job).is_file(), run.job


def test_committed_sweep_sizes():
    main = load_plan(REPO / "benchmarks" / "sweeps" / "h200.toml")
    assert len(main.runs) >= 400 and len(main.configs) >= 60
    gpumemnet = load_plan(REPO / "benchmarks" / "sweeps" / "gpumemnet.toml")
    assert len(gpumemnet.configs) >= 100


@pytest.mark.parametrize(("name", "profile"), [
    ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090")])  # fmt: skip
def test_profile_name(name, profile):
    assert profile_name(name) == profile


def test_csv_header_and_resume_keys(tmp_path):
    path = tmp_path / "g.csv"
    with RowWriter(path) as writer:
        writer.write({"job": "a.py", "args": "--x 1", "status": "ok", "steps": 3})
        writer.write({"job": "b.py", "args": "", "status": "error", "steps": 3})
    rows = read_rows(path)
    assert path.read_text().splitlines()[0] == ",".join(ALL_COLUMNS)
    assert tuple(ALL_COLUMNS[: len(COLUMNS)]) == COLUMNS
    assert {k.job for k in done_keys(rows)} == {"a.py", "b.py"}
    assert {k.job for k in done_keys(rows, retry_errors=True)} == {"a.py"}
    bad = tmp_path / "bad.csv"
    bad.write_text("x,y\n1,2\n")
    with pytest.raises(ValueError, match="missing columns"):
        read_rows(bad)


def test_run_sweep_end_to_end_resume_and_oom_skip(tmp_path, monkeypatch):
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    plan = plan_from_dict(GRID)
    path = tmp_path / "fake.csv"
    log = (tmp_path / "sweep.log").open("w+")
    summary = run_sweep(plan, path, "fake", spawn=fake_spawn, budget_seconds=120, log=log)
    # batch 128 always OOMs; 8 and 32 fit: 4 configs x 3 sizes, all measured
    assert summary.measured == 12 and summary.statuses == {"ok": 8, "oom": 4}
    rows = read_rows(path)
    assert len(rows) == 12 and rows[0]["gpu"] == "fake" and rows[0]["sweep"] == "t"
    assert rows[0]["measured_peak_bytes"] == str(8 * 2**20) and rows[0]["steps"] == "2"
    assert rows[0]["config"] == "benchmarks/zoo/mlp.py --device cuda --precision fp32"
    again = run_sweep(plan, path, "fake", spawn=fake_spawn, budget_seconds=120, log=log)
    assert again.measured == 0 and again.skipped_done == 12
    log.flush()
    assert "=== python benchmarks/zoo/mlp.py" in (tmp_path / "sweep.log").read_text()
    assert list(private.iterdir()) == []  # the runs' result folder went with the sweep


def test_run_sweep_skips_larger_sizes_after_oom(tmp_path):
    plan = plan_from_dict({"group": [{"job": "j.py", "scale": "batch-size",
                                      "grid": {"batch-size": [8, 64, 256, 512]}}]})  # fmt: skip
    summary = run_sweep(plan, tmp_path / "c.csv", "fake", spawn=fake_spawn, budget_seconds=60,
                        log=_log(tmp_path))  # fmt: skip
    assert summary.measured == 2 and summary.skipped_oom == 2


def test_run_sweep_budget_and_crash(tmp_path):
    plan = plan_from_dict({"run": [
        {"job": "j.py", "args": ["--crash"]},
        {"job": "j.py", "args": ["--sleep", "0.5", "--batch-size", "1"]},
        {"job": "j.py", "args": ["--batch-size", "2"]},
    ]})  # fmt: skip
    path = tmp_path / "c.csv"
    # a budget that holds all three (a worker's start-up on a loaded machine takes seconds)
    summary = run_sweep(plan, path, "fake", spawn=fake_spawn, budget_seconds=120,
                        log=_log(tmp_path))  # fmt: skip
    rows = read_rows(path)
    assert rows[0]["status"] == "error" and "code 3" in rows[0]["error"]
    assert summary.measured == 3
    # a budget too small to start anything: nothing runs, everything is left for later
    plan2 = plan_from_dict({"run": [{"job": "j.py", "args": ["--batch-size", "5"]}]})
    left = run_sweep(plan2, path, "fake", spawn=fake_spawn, budget_seconds=3, log=_log(tmp_path))
    assert left.measured == 0 and left.left == 1


def test_run_sweep_records_an_unknown_peak_as_an_error_and_measures_it_again(tmp_path):
    plan = plan_from_dict({"run": [{"job": "j.py", "args": ["--unknown-peak"]}]})
    path = tmp_path / "c.csv"
    summary = run_sweep(plan, path, "fake", spawn=fake_spawn, budget_seconds=60,
                        log=_log(tmp_path))  # fmt: skip
    row = read_rows(path)[0]
    assert summary.statuses == {"error": 1} and row["status"] == "error"
    assert row["error"] == "peak unknown: NVML listed other processes but never this one"
    assert row["measured_peak_bytes"] == "" and row["peak_source"] == "unknown"
    again = run_sweep(plan, path, "fake", spawn=fake_spawn, budget_seconds=60,
                      log=_log(tmp_path))  # fmt: skip
    assert again.measured == 1 and again.skipped_done == 0  # without retry_errors


def test_sweep_cli_plan(tmp_path):
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "sweep.py"),
         str(REPO / "benchmarks" / "sweeps" / "smoke.toml"), "--plan"],
        capture_output=True, text=True, env={"PYTHONPATH": str(REPO / "src"), "PATH": ""},
        check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "smoke:" in out.stderr and "configurations" in out.stderr


def test_real_worker_protocol_without_gpu(tmp_path, monkeypatch):
    """The real worker process: imports, says ready, takes the request, answers with a result
    (here: no GPU, recorded as an error row rather than a hang or a crash)."""
    from peakmem.measure.sweep_run import spawn_worker

    monkeypatch.setenv("PYTHONPATH", str(REPO / "src"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    plan = plan_from_dict({"run": [{"job": "benchmarks/zoo/mlp.py", "args": ["--steps", "1"]}]})
    path = tmp_path / "w.csv"
    summary = run_sweep(plan, path, "none", spawn=spawn_worker(sys.executable),
                        budget_seconds=120, log=_log(tmp_path))  # fmt: skip
    row = read_rows(path)[0]
    assert summary.measured == 1 and row["status"] == "error"
    assert "NoGPUError" in row["error"]


def test_real_worker_runs_a_zoo_job_end_to_end(tmp_path, monkeypatch):
    """sweep -> worker process -> measure_job -> runner -> zoo script (on the CPU, with a fake
    probe): the job stops after the sweep's step count and the row is written."""
    from peakmem.measure.sweep_run import spawn_worker

    monkeypatch.setenv("PYTHONPATH", f"{REPO / 'src'}")
    monkeypatch.chdir(REPO)
    plan = plan_from_dict({"steps": 2, "run": [{"job": "benchmarks/zoo/mlp.py", "args": [
        "--device", "cpu", "--input-size", "8", "--hidden-size", "8", "--num-classes", "2",
        "--batch-size", "4"]}]})  # fmt: skip
    path = tmp_path / "e2e.csv"
    spawn = spawn_worker(sys.executable, extra_args=("--fake-probe",))
    summary = run_sweep(plan, path, "cpu", spawn=spawn, budget_seconds=120, log=_log(tmp_path))
    row = read_rows(path)[0]
    assert summary.statuses == {"ok": 1}, (tmp_path / "sweep.log").read_text()
    assert row["status"] == "ok" and row["steps"] == "2" and row["gpu_name"] == "Fake GPU"


@pytest.mark.gpu
def test_sweep_on_gpu(tmp_path, monkeypatch):
    """Two real runs through the real worker on the GPU: plausible, ordered numbers."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from peakmem.measure.sweep_run import spawn_worker

    monkeypatch.setenv("PYTHONPATH", str(REPO / "src"))
    monkeypatch.chdir(REPO)
    plan = plan_from_dict({"group": [{"job": "benchmarks/zoo/mlp.py", "scale": "batch-size",
                                      "grid": {"batch-size": [64, 4096]}}]})  # fmt: skip
    path = tmp_path / "gpu.csv"
    summary = run_sweep(plan, path, "gpu", spawn=spawn_worker(sys.executable),
                        budget_seconds=300, log=_log(tmp_path))  # fmt: skip
    assert summary.statuses == {"ok": 2}, (tmp_path / "sweep.log").read_text()[-3000:]
    small, large = read_rows(path)
    for row in (small, large):
        peak, reserved, allocated, context = (
            int(row[k])
            for k in (
                "measured_peak_bytes",
                "max_reserved_bytes",
                "max_allocated_bytes",
                "context_bytes",
            )
        )
        assert peak >= reserved >= allocated > 0
        assert context > 50 * 2**20 and float(row["sample_hz"]) >= 100
    assert int(large["max_allocated_bytes"]) > int(small["max_allocated_bytes"])
