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


def test_mpi_discovery_without_mpi4py_is_a_singleton_world(monkeypatch):
    """`deepspeed.init_distributed()` without a launcher: MPI discovery (mpi4py) answered as
    rank 0 of 1 where mpi4py is not installed (it raised ModuleNotFoundError)."""
    from types import SimpleNamespace

    from peakmem.capture import deepspeed_ops

    if importlib.util.find_spec("mpi4py") is not None:
        pytest.skip("mpi4py is installed: DeepSpeed's own discovery runs")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "")  # recorded: the variables the patch sets are undone after
        monkeypatch.delenv(name)

    def discovery(distributed_port=29500, verbose=True):
        from mpi4py import MPI  # noqa: F401  (deepspeed.comm.comm.mpi_discovery's first line)

    comm = SimpleNamespace(mpi_discovery=discovery)
    with pytest.raises(ModuleNotFoundError):
        comm.mpi_discovery()
    undo = deepspeed_ops._singleton_mpi_discovery(comm)
    try:
        comm.mpi_discovery(distributed_port=29511)
    finally:
        undo()
    assert {name: os.environ[name] for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")} == {
        "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_PORT": "29511"}
    assert comm.mpi_discovery is discovery
