"""The software of the machine a ground-truth CSV was measured on, next to the CSV as
`<csv stem>_versions.json` (benchmarks/sweep.py writes it at the start of a sweep): the rows record
torch, CUDA and the driver, not the libraries whose releases change what a job allocates (e.g.
transformers: capture/hf_release.py).

The versions are read in a child Python (the interpreter the sweep's workers run), so the sweep's
own process never imports torch nor touches CUDA before its runs; the driver and the GPU's name
come from nvidia-smi."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

PACKAGES = ("torch", "torchvision", "transformers", "timm", "numpy")

# Runs in the child: package versions by import (a missing one is None), CUDA and cuDNN as the
# torch build reports them (torch.backends.cudnn.version() loads cuDNN; no CUDA context).
_SCRIPT = f"""
import importlib, json, platform
out = {{"python": platform.python_version()}}
for name in {PACKAGES!r}:
    try:
        out[name] = str(getattr(importlib.import_module(name), "__version__", None))
    except Exception:
        out[name] = None
try:
    import torch
    out["cuda"] = torch.version.cuda
    out["cudnn"] = torch.backends.cudnn.version()
except Exception:
    out["cuda"] = out["cudnn"] = None
print(json.dumps(out))
"""


def versions_path(csv_path: Path) -> Path:
    """`benchmarks/groundtruth/h200.csv` -> `benchmarks/groundtruth/h200_versions.json`."""
    return csv_path.with_name(f"{csv_path.stem}_versions.json")


def _nvidia_smi() -> dict[str, str | None]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"driver": None, "gpu": None}
    out = subprocess.run([smi, "--query-gpu=driver_version,name", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
    first = next((line for line in out.stdout.splitlines() if line.strip()), "")
    driver, _, name = first.partition(",")
    return {"driver": driver.strip() or None, "gpu": name.strip() or None}


def collect_versions(python: str = sys.executable) -> dict:
    """The versions `python`'s environment holds, the driver and the GPU, and when (UTC)."""
    out = subprocess.run([python, "-c", _SCRIPT], capture_output=True, text=True, check=False,
                         timeout=300)  # fmt: skip
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"reading the package versions failed: {out.stderr.strip()[-500:]}")
    versions = json.loads(lines[-1])
    versions.update(_nvidia_smi())
    versions["recorded_at"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return versions


def write_versions(csv_path: Path, versions: dict) -> tuple[Path, list[str]]:
    """Write the versions next to the CSV; returns the path and the packages whose recorded
    release changed (the CSV's earlier rows were measured with another image)."""
    path = versions_path(csv_path)
    changed = []
    try:
        previous = read_versions(csv_path)
    except ValueError:  # an unreadable earlier file is replaced: nothing to compare with
        previous = None
    if previous is not None:
        changed = [key for key in ("torch", "transformers", "timm", "torchvision", "cudnn")
                   if key in previous and previous.get(key) != versions.get(key)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(versions, indent=1) + "\n")
    return path, changed


MAX_VERSIONS_BYTES = 2**20
"""The file is a dozen short fields (~300 bytes); a larger one is not this file."""


def read_versions(csv_path: Path) -> dict | None:
    """The versions recorded next to the CSV, or None where there is no file. ValueError (one
    line naming the file) where it is larger than MAX_VERSIONS_BYTES, not UTF-8 JSON, or not an
    object: the caller stops (the bench: one line, exit 2) rather than estimate the CSV's rows
    with releases nobody recorded."""
    path = versions_path(csv_path)
    if not path.is_file():
        return None
    try:
        size = path.stat().st_size
        if size > MAX_VERSIONS_BYTES:
            raise ValueError(f"{size} bytes, more than a versions file ({MAX_VERSIONS_BYTES} at "
                             "most)")
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # JSON and UTF-8 errors are ValueErrors
        reason = " ".join(str(exc).split())[:160] or type(exc).__name__
        raise ValueError(f"{path}: not a readable versions file ({reason})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data
