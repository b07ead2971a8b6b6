"""benchmarks/gpu_next_lease.sh without a GPU: bash syntax, the dry run's one archive (every
step's plan in it, nothing else left in $OUT), and the zoo shapes file the lease measures."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_next_lease.sh"
SHAPES = REPO / "benchmarks" / "data" / "zoo_conv_shapes.csv"
sys.path.insert(0, str(REPO / "benchmarks"))
import cudnn_probe as cp  # noqa: E402
import first_use_probe as fu  # noqa: E402


def test_scripts_parse():
    for name in ("gpu_next_lease.sh", "make_zoo_conv_shapes.sh"):
        subprocess.run(["bash", "-n", str(REPO / "benchmarks" / name)], check=True)


def run_lease(tmp_path, *args, **env):
    environ = {**os.environ, "PYTHON": sys.executable, "LEASE_WORK": str(tmp_path / "work"), **env}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=environ, text=True,
                          capture_output=True, timeout=120)  # fmt: skip


def test_dry_run_packs_every_step_into_one_archive(tmp_path):
    out = tmp_path / "out"
    done = run_lease(tmp_path, "300", "--dry-run", OUT=str(out))
    assert done.returncode == 0, done.stderr
    assert [p.name for p in out.iterdir()] == ["lease.tgz"]
    with tarfile.open(out / "lease.tgz") as archive:
        names = {n.removeprefix("./") for n in archive.getnames()}
        read = lambda name: archive.extractfile(f"./{name}").read().decode()  # noqa: E731
        plan = list(csv.DictReader(io.StringIO(read("conv/cudnn_grid_plan.csv"))))
        first_use_header = read("first_use/first_use.csv").strip()
        log = read("run.log")
        sweep_plan = read("sweeps/plan.txt")
    assert {"conv/cudnn_grid.csv", "nvml/side_by_side.json", "versions.json"} <= names
    # the conv step: every case of the shapes file, benchmark off then on
    cases = cp.read_shapes(SHAPES)
    assert len(plan) == 2 * len(cases)
    assert [r["benchmark"] for r in plan] == ["0"] * len(cases) + ["1"] * len(cases)
    assert {r["source"] for r in plan} == {"shapes"}
    assert first_use_header.startswith("run,module_loading,process")
    for family in fu.NEXT_LEASE_ISOLATE:
        assert f"common {family}\n" in log
    assert "sequence" not in log  # --modes "": isolated processes only
    assert [line.split("== ")[1][:2] for line in log.splitlines() if "== " in line] == [
        "1.", "2.", "3.", "4.", "do"]
    # time boxes: 30 % of 300 s for the conv shapes, 25 % for first use
    assert "conv shapes, 90 s" in log and "first use, 75 s" in log
    assert "not yet in" in sweep_plan


def test_without_out_it_stops(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    done = subprocess.run(["bash", str(SCRIPT), "60", "--dry-run"], cwd=REPO, env=env,
                          text=True, capture_output=True, timeout=60)  # fmt: skip
    assert done.returncode != 0 and "set OUT" in done.stderr


@pytest.mark.parametrize("batch", [16, 32, 64, 128, 256])
def test_shapes_file_holds_the_mobilenet_head_prediction(batch):
    # docs/MEASURE.md: the bf16 NCHW backward-weight of n x 320 x 7 x 7 -> 1280 (1x1, no bias)
    heads = [r for r in cp.read_shapes(SHAPES)
             if (r.shape.n, r.shape.cin, r.shape.h, r.shape.cout, r.shape.kernel) ==
             (batch, 320, 7, 1280, 1) and r.dtype_mode == "bf16" and r.layout == "nchw"]  # fmt: skip
    assert len(heads) == 1 and heads[0].shape.bias == 0


def test_shapes_file_holds_resnet50_at_every_batch_and_precision():
    cases = cp.read_shapes(SHAPES)
    stems = {(r.shape.n, r.dtype_mode) for r in cases
             if (r.shape.cin, r.shape.h, r.shape.cout, r.shape.kernel, r.shape.stride) ==
             (3, 224, 64, 7, 2)}  # fmt: skip
    assert {(n, m) for n in (64, 128, 256) for m in ("tf32", "bf16", "fp16")} <= stems


STUB_PYTHON = """#!/usr/bin/env bash
# a stand-in interpreter: heredoc scripts run for real, -c prints versions, the rest is logged
if [ "$1" = "-" ]; then exec {real} "$@"; fi
if [ "$1" = "-c" ]; then echo '{{"gpu": "stub"}}'; exit 0; fi
echo "$*" >> {log}
case "$1" in *sweep.py) sleep 2.5 ;; esac
"""
STUB_SMI = """#!/usr/bin/env bash
case "$*" in
  *-lms*) while true; do echo "2026/11/27 22:00:00.000, 1024, 143771"; sleep 0.2; done ;;
  *name,driver*) echo "NVIDIA H200, 570.00, 143771 MiB, 0 MiB" ;;
  *) echo "NVIDIA H200" ;;
esac
"""


def test_gpu_steps_in_order_with_stub_tools(tmp_path):
    """The non-dry path with a stub interpreter and nvidia-smi: each step's command and time box,
    the four sweeps seeded from the committed CSV, the device log in the archive."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.log"
    stub = bin_dir / "python-stub"
    stub.write_text(STUB_PYTHON.format(real=sys.executable, log=calls))
    (bin_dir / "nvidia-smi").write_text(STUB_SMI)
    for path in (stub, bin_dir / "nvidia-smi"):
        path.chmod(0o755)
    out = tmp_path / "out"
    done = run_lease(tmp_path, "400", OUT=str(out), PYTHON=str(stub), LEASE_PACK_EVERY="1",
                     PATH=f"{bin_dir}:{os.environ['PATH']}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = calls.read_text().splitlines()
    assert lines[0].startswith("benchmarks/cudnn_probe.py ") and "--shapes " in lines[0]
    assert "--benchmark off,on --budget-s 120" in lines[0]  # 30 % of 400 s
    assert lines[1].endswith("--modes  --isolate next --budget-s 100")  # 25 %
    assert lines[2].startswith("benchmarks/nvml_side_by_side.py ") and "--gib 1,8" in lines[2]
    sweeps = lines[3:]
    assert len(sweeps) == 4 and all(s.startswith("benchmarks/sweep.py ") for s in sweeps)
    assert {s.split()[1] for s in sweeps} == {"benchmarks/sweeps/h200.toml",
                                              "benchmarks/sweeps/gpumemnet.toml",
                                              "/tmp/h200_rev.toml", "/tmp/gpumemnet_rev.toml"}
    committed = (REPO / "benchmarks" / "groundtruth" / "h200.csv").read_bytes()
    work = tmp_path / "work"
    for name in "abcd":
        assert (work / "sweeps" / f"{name}.csv").read_bytes() == committed  # resumes
    with tarfile.open(out / "lease.tgz") as archive:
        names = {n.removeprefix("./") for n in archive.getnames()}
        log = archive.extractfile("./run.log").read().decode()
    assert {"device_memory.csv.gz", "versions.json", "sweeps/a.csv"} <= names
    assert "device_memory.csv" not in names and "profile h200" in log
    assert "packed" in log.split("== 4. sweeps")[1].split("sweep a rows")[0]  # while they ran
