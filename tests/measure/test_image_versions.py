"""The versions of the image a ground-truth CSV was measured with (measure/image_versions.py),
written by benchmarks/sweep.py next to the CSV and read by the estimate of its rows."""

from __future__ import annotations

import importlib.util
import json
import stat
import sys
from pathlib import Path

from click.testing import CliRunner

from peakmem.baselines import peakmem_estimator
from peakmem.measure import image_versions
from peakmem.measure.image_versions import (
    collect_versions,
    read_versions,
    versions_path,
    write_versions,
)

REPO = Path(__file__).resolve().parents[2]


def fake_python(tmp_path: Path) -> str:
    """A Python that sees only stand-ins of torch (2.11.0+cu130, CUDA 13.0, cuDNN 9.19) and
    transformers 5.17.0 (-S: no site-packages), as the device image would report them."""
    modules = tmp_path / "modules"
    (modules / "torch" / "backends").mkdir(parents=True)
    (modules / "torch" / "__init__.py").write_text(
        "__version__ = '2.11.0+cu130'\nfrom torch import backends, version\n")
    (modules / "torch" / "version.py").write_text("cuda = '13.0'\n")
    (modules / "torch" / "backends" / "__init__.py").write_text("from torch.backends import cudnn\n")
    (modules / "torch" / "backends" / "cudnn.py").write_text("def version():\n    return 91900\n")
    (modules / "transformers.py").write_text("__version__ = '5.17.0'\n")
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{modules}" exec "{sys.executable}" -S "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    return str(wrapper)


def test_versions_are_read_in_a_child_python(tmp_path, monkeypatch):
    monkeypatch.setattr(image_versions.shutil, "which", lambda name: None)  # no nvidia-smi
    versions = collect_versions(fake_python(tmp_path))
    assert {k: versions[k] for k in ("torch", "transformers", "cuda", "cudnn")} == {
        "torch": "2.11.0+cu130", "transformers": "5.17.0", "cuda": "13.0", "cudnn": 91900}
    assert versions["timm"] is None and versions["torchvision"] is None  # not installed there
    assert versions["driver"] is None and versions["gpu"] is None


def test_driver_and_gpu_come_from_nvidia_smi(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '580.159.04, NVIDIA H200'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(image_versions.shutil, "which", lambda name: str(smi))
    versions = collect_versions(fake_python(tmp_path))
    assert (versions["driver"], versions["gpu"]) == ("580.159.04", "NVIDIA H200")


def test_written_next_to_the_csv_and_changes_reported(tmp_path):
    csv = tmp_path / "h200.csv"
    assert versions_path(csv) == tmp_path / "h200_versions.json"
    assert read_versions(csv) is None
    path, changed = write_versions(csv, {"torch": "2.11.0+cu130", "transformers": "5.17.0"})
    assert path == versions_path(csv) and changed == []
    assert read_versions(csv) == {"torch": "2.11.0+cu130", "transformers": "5.17.0"}
    _, changed = write_versions(csv, {"torch": "2.11.0+cu130", "transformers": "5.20.0"})
    assert changed == ["transformers"]


def test_the_rows_release_is_read_from_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(peakmem_estimator, "GROUNDTRUTH_DIR", tmp_path)
    assumed = peakmem_estimator.ASSUMED_GROUNDTRUTH_TRANSFORMERS_RELEASE
    assert peakmem_estimator.groundtruth_transformers_release("h200") == assumed  # no file
    (tmp_path / "h200_versions.json").write_text(json.dumps({"transformers": "5.20.0"}))
    assert peakmem_estimator.groundtruth_transformers_release("h200") == "5.20.0"


def test_the_committed_h200_file_names_the_measured_release():
    versions = read_versions(REPO / "benchmarks" / "groundtruth" / "h200.csv")
    assert versions["transformers"] == "5.17.0" and versions["torch"] == "2.11.0+cu130"


def load_sweep_script():
    spec = importlib.util.spec_from_file_location("sweep_script", REPO / "benchmarks" / "sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sweep_records_versions_before_its_runs(tmp_path, monkeypatch):
    """benchmarks/sweep.py writes `<csv stem>_versions.json` before it makes its workers."""
    sweep = load_sweep_script()
    order = []

    def versions(python):
        order.append("versions")
        return {"torch": "2.11.0+cu130", "transformers": "5.17.0"}

    def spawn_worker(*args, **kwargs):
        order.append("workers")

        def spawn(log):
            raise AssertionError("no run starts with no budget")

        return spawn

    monkeypatch.setattr(sweep, "collect_versions", versions)
    monkeypatch.setattr(sweep, "spawn_worker", spawn_worker)
    csv = tmp_path / "h200.csv"
    result = CliRunner().invoke(sweep.main, [str(REPO / "benchmarks" / "sweeps" / "smoke.toml"),
                                             "--gpu", "h200", "--csv", str(csv),
                                             "--budget-seconds", "0"])
    assert result.exit_code == 0, result.output
    assert order == ["versions", "workers"]
    assert read_versions(csv) == {"torch": "2.11.0+cu130", "transformers": "5.17.0"}
