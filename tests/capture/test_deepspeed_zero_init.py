"""`deepspeed.zero.Init()` replaces `torch.Tensor.__new__` while a model is built; torch._dynamo
imported for the first time then (the capture's modes call `torch._disable_dynamo` functions,
whose first call imports it) fails on that replacement's signature. The capture imports dynamo
before zero.Init installs its wrappers (capture/deepspeed_ops.py)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("deepspeed") is None:
    pytest.skip("deepspeed is not installed", allow_module_level=True)

SRC = Path(__file__).resolve().parents[2] / "src"

SCRIPT = """
import sys
from contextlib import nullcontext
from types import SimpleNamespace
import torch
from peakmem.capture.deepspeed_ops import deepspeed_zero_init_dynamo

patch = deepspeed_zero_init_dynamo() if sys.argv[1] == "patched" else nullcontext()
with patch:
    from deepspeed.runtime.zero import partition_parameters as zero
    assert "torch._dynamo" not in sys.modules
    init = SimpleNamespace(tensor_overrides=set())  # zero.Init's state that the wrappers read
    torch.Tensor.__old_new__ = torch.Tensor.__new__  # as zero.Init.__init__ keeps it
    zero.Init._add_tensor_creation_wrappers(init)
    try:
        # a torch function that lazily imports dynamo, called while the model is built
        print(torch._disable_dynamo(lambda: "called")())
    finally:
        zero.Init._remove_tensor_creation_wrappers(init)
"""


def _run(variant: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-c", SCRIPT, variant], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.slow
def test_dynamo_first_imported_under_zero_init_wrappers():
    unpatched = _run("plain")
    assert unpatched.returncode != 0 and "Signature mismatch" in unpatched.stderr, unpatched.stderr[-2000:]
    patched = _run("patched")
    assert patched.returncode == 0, patched.stderr[-2000:]
    assert patched.stdout.strip().splitlines()[-1] == "called"
