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
    environ = dict(os.environ, PYTHON=sys.executable, LEASE_WORK=str(tmp_path / "work"), **env)
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
