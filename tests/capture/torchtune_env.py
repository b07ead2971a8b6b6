"""Where torchtune's jobs can run in the tests.

torchtune 0.6.1 (its latest release) imports torchao modules that torchao 0.16 removed
(`torchao.dtypes.nf4tensor` moved, `int4_weight_only` went), while peft >= 0.19 refuses any
torchao below 0.16 when one is installed: the two cannot share one environment. The dev
environment keeps the current torchao (PEFT's LoRA jobs need it), and `.ci/run` installs torchao
0.15 alone into a side directory, `.ci/site-torchao-0.15`; torchtune's jobs run in their own job
processes with that directory first on their PYTHONPATH, as a user with torchtune's own
environment would run them.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

LEGACY_TORCHAO = Path(__file__).resolve().parents[2] / ".ci" / "site-torchao-0.15"
"""torchao 0.15, installed there by `.ci/run` (pip install --no-deps --target)."""

_PROBE = "import torchtune.training"


def _imports_with(extra: str) -> bool:
    env = dict(os.environ)
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra, env.get("PYTHONPATH", "")) if p)
    probe = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                           timeout=300)
    return probe.returncode == 0


def torchtune_pythonpath() -> str:
    """What torchtune's job processes need first on PYTHONPATH: "" when torchtune imports in this
    environment, else the side directory with torchao 0.15; skips the calling test (or module)
    when neither imports torchtune."""
    if importlib.util.find_spec("torchtune") is None:
        pytest.skip("torchtune is not installed", allow_module_level=True)
    try:
        import torchtune.training  # noqa: F401
        return ""
    except ImportError as exc:
        reason = str(exc)
    if LEGACY_TORCHAO.is_dir() and _imports_with(str(LEGACY_TORCHAO)):
        return str(LEGACY_TORCHAO)
    pytest.skip(f"torchtune cannot import here ({reason}), and no torchao 0.15 in "
                f"{LEGACY_TORCHAO} (installed by .ci/run)", allow_module_level=True)
    raise AssertionError("unreachable")


def with_torchtune_path(patch: pytest.MonkeyPatch, extra: str) -> None:
    """Put `extra` first on the PYTHONPATH the job processes inherit."""
    if extra:
        patch.setenv("PYTHONPATH",
                     os.pathsep.join(p for p in (extra, os.environ.get("PYTHONPATH", "")) if p))
