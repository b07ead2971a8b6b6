"""The k9 adversarial sweep's regressions (benchmarks/hostile_sweep_k9.py runs the whole sweep):
one test per class of hostile input that broke the contract before its fix. Each docstring says
what went wrong."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from peakmem.capture import capture_callable  # before any test replaces a Tensor method: as in
from peakmem.capture.replaced_methods import ORIGINAL, canonical  # a job, peakmem comes first
from peakmem.profiles import load_gpu, load_stack

GIB = 1 << 30


def _capture(job):
    return capture_callable(job, gpu=load_gpu("a100-40gb"), stack=load_stack("2.4.1"))


# -- a job given as compiled code (`python train.pyc`) ------------------------------------------


def _pyc(tmp_path: Path, source: str) -> bytes:
    (tmp_path / "src.py").write_text(source)
    py_compile.compile(str(tmp_path / "src.py"), cfile=str(tmp_path / "src.pyc"), doraise=True)
    return (tmp_path / "src.pyc").read_bytes()


@pytest.mark.parametrize("name", ["train.pyc", "train.py"])
def test_a_compiled_script_runs_as_python_runs_it(name, tmp_path):
    """`python train.pyc` runs the marshalled code (CPython's `maybe_pyc_file`: a .pyc name, or
    the magic number's first two bytes whatever the name); peakmem compiled the bytes as source
    and called the job failed: `SyntaxError: source code string cannot contain null bytes`."""
    from peakmem.jobs.runner import run_script_file

    out = tmp_path / "ran.txt"
    script = tmp_path / name
    script.write_bytes(_pyc(tmp_path, f"open({str(out)!r}, 'w').write(__file__ + ' ' + __name__)\n"))
    run_script_file(str(script))
    assert out.read_text() == f"{script} __main__"


@pytest.mark.parametrize("damage", ["magic", "truncated"])
def test_a_broken_compiled_script_fails_as_python_fails(damage, tmp_path):
    """A .pyc with another python's magic number, or cut short, is refused with python's own
    RuntimeError (measured here by running `python` on the same file)."""
    from peakmem.jobs.runner import run_script_file

    good = _pyc(tmp_path, "print('ran')\n")
    bad = b"\0\0\0\0" + good[4:] if damage == "magic" else good[:20]
    script = tmp_path / "train.pyc"
    script.write_bytes(bad)
    python = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=30)
    said = python.stderr.strip().splitlines()[-1]
    assert python.returncode == 1 and said.startswith("RuntimeError: Bad "), python.stderr
    with pytest.raises(RuntimeError) as raised:
        run_script_file(str(script))
    assert f"RuntimeError: {raised.value}" == said


# -- Tensor methods the job replaced ------------------------------------------------------------


@pytest.fixture
def restore_tensor_methods():
    before = {name: vars(torch.Tensor).get(name) for name in ("to", "cuda")}
    yield
    for name, value in before.items():
        if value is None:
            if name in vars(torch.Tensor):
                delattr(torch.Tensor, name)
        else:
            setattr(torch.Tensor, name, value)


def _logged_to():
    calls = []
    original = torch.Tensor.to

    def to(self, *args, **kwargs):
        calls.append(args)
        return original(self, *args, **kwargs)

    torch.Tensor.to = to
    return calls


def _moves(device: str, seen: dict) -> None:
    calls = _logged_to()
    seen["to"] = torch.empty(GIB, dtype=torch.uint8).to(device)
    seen["cuda"] = torch.empty(GIB, dtype=torch.uint8).cuda() if device == "cuda" else None
    seen["model"] = torch.nn.Linear(1024, 1024).to(device)
    seen["calls"] = len(calls)


def test_a_wrapped_tensor_to_still_moves_to_the_device(restore_tensor_methods):
    """`torch.Tensor.to = logged_to` (a wrapper that calls the original): torch hands the call
    to the capture's modes as `logged_to`, looked up on `torch.Tensor` by name, and the modes
    (keyed by the original `Tensor.to`, and comparing `func is Tensor.to` at call time) passed
    it on as an unknown function: the real `to("cuda")` failed the job with `PyTorch is not
    linked with support for cuda devices`. The wrapper runs as often as without peakmem (once
    per `.to`, `Module.to`'s per parameter; `.cuda()` is a C method that does not call it)."""
    plain: dict = {}
    _moves("cpu", plain)
    seen: dict = {}

    def job():
        _moves("cuda", seen)
        seen["devices"] = [seen[k].is_cuda for k in ("to", "cuda")] + [seen["model"].weight.is_cuda]

    result = _capture(job)
    assert result.error is None, result.error_text
    assert seen["devices"] == [True, True, True]
    assert seen["calls"] == plain["calls"] == 3
    assert result.trace.sizes.count(GIB) == 2
    assert (1024 * 1024 * 4) in result.trace.sizes  # the model's weight


def test_a_no_op_tensor_to_does_not_stop_cuda_moving(restore_tensor_methods):
    """`torch.Tensor.to = lambda self, *a, **k: self`: `.cuda()` (a method of its own in C)
    still moves the tensor on a GPU; peakmem's `.cuda()` handler moved it with `tensor.to`,
    the job's no-op, and the 1 GiB tensor stayed off the device (peak 0). A `.to("cuda")` the
    job made a no-op moves nothing, as on a GPU."""
    seen = {}

    def job():
        torch.Tensor.to = lambda self, *args, **kwargs: self
        seen["cuda"] = torch.empty(GIB, dtype=torch.uint8).cuda()
        seen["to"] = torch.empty(GIB, dtype=torch.uint8).to("cuda")
        seen["devices"] = [seen["cuda"].is_cuda, seen["to"].is_cuda]

    result = _capture(job)
    assert result.error is None, result.error_text
    assert seen["devices"] == [True, False]
    assert result.trace.sizes.count(GIB) == 1


def test_canonical_maps_only_replacements(restore_tensor_methods):
    original = torch.Tensor.to
    _logged_to()
    assert canonical(torch.Tensor.to) is original is ORIGINAL["to"]
    assert canonical(original) is original
    assert canonical(torch.nn.functional.dropout) is torch.nn.functional.dropout
    assert canonical(os.getpid) is os.getpid


# -- builtins and library functions the job registers with atexit -------------------------------


def test_what_the_job_registers_with_atexit_runs_when_its_script_ends():
    """`atexit.register(os._exit, 5)`, `atexit.register(torch.empty, ..., device="cuda")`: the
    job's code registers them, but they are not defined in its files, so they went to the real
    atexit, which peakmem's child never runs (it ends with os._exit): python's exit status 5 was
    an estimate (exit 0), the allocation was not counted. What the job's own code registers is
    the job's; what a library's code registers (here: code compiled as the standard library's)
    still goes to the real atexit."""
    import atexit
    import sysconfig

    from peakmem.jobs.exit_handlers import job_exit_handlers

    seen: list[str] = []
    library_file = os.path.join(sysconfig.get_paths()["stdlib"], "k9_library.py")
    library = compile("atexit.register(seen.append, 'library')", library_file, "exec")
    with job_exit_handlers() as handlers:
        atexit.register(seen.append, "builtin")
        exec(library, {"atexit": atexit, "seen": seen})
        assert [entry[0] for entry in handlers.handlers] == [seen.append]
        assert handlers.run() == 1
    atexit.unregister(seen.append)
    assert seen == ["builtin"]


@pytest.mark.parametrize("line, says", [
    ("atexit.register(os._exit, 5)", "the job ended its process with os._exit(5)"),
    ("atexit.register(torch.empty, 1 << 30, dtype=torch.uint8, device='cuda')", None),
])
def test_a_builtin_exit_handler_acts_as_on_a_gpu(line, says, tmp_path):
    from peakmem.estimate import EstimateError, estimate_command

    script = tmp_path / "train.py"
    script.write_text("import atexit, os, torch\nx = torch.zeros(1024, device='cuda')\n"
                      + line + "\n")
    if says is None:
        result = estimate_command(["python", str(script)], gpu="a100-40gb", mode="fake",
                                  timeout=120, isolate=False)
        assert GIB <= result.peak_allocated_bytes < 2 * GIB
        return
    with pytest.raises(EstimateError) as failed:
        estimate_command(["python", str(script)], gpu="a100-40gb", mode="fake", timeout=120)
    assert says in failed.value.message


# -- a job that takes the capture's mode off torch's stack --------------------------------------


def test_a_job_that_pops_the_capture_mode_is_refused_in_one_line():
    """`torch._C._pop_torch_function_stack()` in the job: torch's own exit of the mode raised
    `trying to pop from empty mode stack` in place of the job's outcome, a peakmem traceback
    reported as the job's error; what the job made after that went unseen. Now: `unsupported`,
    one line naming what the job did."""
    from peakmem.capture.capture_modes import ModesRemoved

    def job():
        torch.empty(1 << 20, device="cuda")
        while torch._C._len_torch_function_stack():
            torch._C._pop_torch_function_stack()

    result = _capture(job)
    assert isinstance(result.error, ModesRemoved) and result.reason == "unsupported"
    assert result.error_text.startswith("peakmem does not support jobs that take peakmem's "
                                        "torch function mode off torch's mode stack")
    assert "\n" not in result.error_text
    assert torch._C._len_torch_function_stack() == 0


# -- a job that replaces peakmem's modules in sys.modules ---------------------------------------


@pytest.mark.parametrize("stand_in", ["bare module", "None"])
def test_a_job_that_replaces_peakmems_modules_is_refused_in_one_line(stand_in):
    """`sys.modules["peakmem..."] = types.ModuleType(...)` (or None) in the job: the capture's
    next lazy import failed, and peakmem's ImportError (`cannot import name 'gpu_index' from
    'peakmem.capture.device_map' (unknown location)`) was reported as the job's own error, where
    `python train.py` runs (the job does not use peakmem). Now: `unsupported`, naming the
    module."""
    import types

    def job():
        saved = {name: module for name, module in sys.modules.items()
                 if name.split(".")[0] == "peakmem"}
        try:
            for name in saved:
                sys.modules[name] = None if stand_in == "None" else types.ModuleType(name)
            torch.nn.Linear(16, 16).cuda()
        finally:
            sys.modules.update(saved)

    result = _capture(job)
    assert result.reason == "unsupported", result.error_text
    assert result.error_text.startswith("peakmem does not support jobs that replace peakmem's "
                                        "own module peakmem.")
    assert "\n" not in result.error_text
