"""Run the k9 adversarial sweep: hostile inputs none of the k5-k8 sweeps tries.

    PYTHONPATH=src python benchmarks/hostile_sweep_k9.py [--only SUBSTRING] [--jobs N]

Same contract and judge as k5 (`run_case`) with k6's, k7's and k8's extra checks (`json_out`,
`peak_at_least`, `stdout_has`, ...), run by the shared runner (hostile_sweep_common.py). Classes:
jobs given as compiled code (`python train.pyc`, a .pyc under a .py name, a broken one), as a
zipapp, a directory or a local package with `__main__.py`, in a coding-cookie or UTF-16 file, with
10^4 arguments; jobs that replace `Tensor.to` / `Tensor.cuda` / `nn.Module.cuda` (a logging
wrapper, a no-op), that register builtins with `atexit` (`os._exit(5)`, `sys.exit(3)`), that
end with `sys.exit(main())` of odd values, that replace the standard library functions peakmem's
child uses after the job (`os._exit`, `os.getpid`, `time.monotonic`, `os.write`, `sys.exit`,
`Thread.start`, `signal.signal`), that replace peakmem's modules in `sys.modules`, and that step
around the capture's torch function and dispatch modes (`DisableTorchFunction`, popping the
mode stack, `_disable_current_modes`).
"""

from __future__ import annotations

import importlib.util
import io
import marshal
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hostile_sweep_common import run_guarded  # noqa: E402
from hostile_sweep_k5 import TRAIN  # noqa: E402
from hostile_sweep_k5 import main as k5_main  # noqa: E402
from hostile_sweep_k6 import materialise  # noqa: E402
from hostile_sweep_k8 import Case8, check  # noqa: E402

GIB = 1 << 30
HOLD = "keep = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n"
JOB = TRAIN + HOLD


def _case(name: str, surface: str, argv: list[str], codes: set[int] | int, **kw) -> Case8:
    codes = {codes} if isinstance(codes, int) else codes
    return Case8(name, surface, tuple(argv), frozenset(codes), **kw)


def _pyc(source: str) -> bytes:
    """The .pyc python writes for `source` (magic, flags 0, mtime 0, size 0, the code)."""
    code = compile(source, "train.py", "exec", dont_inherit=True)
    return importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(code)


def _zipapp(source: str) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("__main__.py", source)
    return out.getvalue()


def job_forms() -> list[Case8]:
    """The job's program in a form other than a plain UTF-8 script."""
    est = ["estimate", "--json"]
    good = _pyc(JOB)
    rows = [
        # (label, files, argv after estimate --json, exit codes, peak at least)
        ("pyc only", {"train.pyc": good}, ["train.pyc"], {0}, GIB),
        ("pyc only, python prefix", {"train.pyc": good}, ["--", "python", "train.pyc"], {0}, GIB),
        ("pyc under a .py name", {"train.py": good}, ["train.py"], {0}, GIB),
        ("pyc with another python's magic", {"train.pyc": b"\0\0\0\0" + good[4:]}, ["train.pyc"], {1}, 0),
        ("pyc cut short", {"train.pyc": good[:20]}, ["train.pyc"], {1}, 0),
        ("zipapp", {"app.pyz": _zipapp(JOB)}, ["app.pyz"], {0}, GIB),
        ("directory with __main__.py", {"app/__main__.py": JOB}, ["--", "python", "app"], {0}, GIB),
        ("-m local package", {"pkg/__init__.py": "", "pkg/__main__.py": JOB},
         ["--", "python", "-m", "pkg"], {0}, GIB),
        ("coding cookie latin-1", {"train.py": ("# -*- coding: latin-1 -*-\ns = 'caf\xe9'\n" + JOB).encode("latin-1")},
         ["train.py"], {0}, GIB),
        ("UTF-16 source (python refuses it)", {"train.py": JOB.encode("utf-16")}, ["train.py"], {1}, 0),
        ("10^4 arguments", {"train.py": JOB}, ["train.py", *(f"a{i}" for i in range(10_000))], {0}, GIB),
    ]
    return [_case(f"job {label}", "job forms", [*est, *argv], codes, files=files, json_out=True,
                  peak_at_least=peak, job_traceback=True, job_stderr=True, timeout=300)
            for label, files, argv, codes, peak in rows]


def tampering_jobs() -> list[Case8]:
    est = ["estimate", "--json"]
    wrap_to = ("import torch\n_to = torch.Tensor.to\ndef to(self, *a, **k):\n  return _to(self, *a, **k)\n"
               "torch.Tensor.to = to\n")
    jobs = {
        # (body, exit codes, peak_allocated_bytes at least)
        "Tensor.to wrapped, .to('cuda')": (wrap_to + "k = torch.empty(1 << 30, dtype=torch.uint8).to('cuda')\n", {0}, GIB),
        "Tensor.to wrapped, model.to('cuda')": (wrap_to + "m = torch.nn.Linear(16384, 16384).to('cuda')\n", {0}, GIB),
        "Tensor.to a no-op, .cuda()": ("import torch\ntorch.Tensor.to = lambda self, *a, **k: self\n"
                                       "k = torch.empty(1 << 30, dtype=torch.uint8).cuda()\n", {0}, GIB),
        "Tensor.cuda a no-op, .to('cuda')": ("import torch\ntorch.Tensor.cuda = lambda self, *a, **k: self\n"
                                             "k = torch.empty(1 << 30, dtype=torch.uint8).to('cuda')\n", {0}, GIB),
        "Module.cuda a no-op, .to('cuda')": ("import torch\ntorch.nn.Module.cuda = lambda self, *a, **k: self\n"
                                             "m = torch.nn.Linear(16384, 16384).to('cuda')\n", {0}, GIB),
        "atexit.register(os._exit, 5)": (JOB + "import atexit, os\natexit.register(os._exit, 5)\n", {1}, 0),
        "atexit.register(sys.exit, 3)": (JOB + "import atexit, sys\natexit.register(sys.exit, 3)\n", {1}, 0),
        "atexit.register(torch.empty) on the device": (
            TRAIN + "import atexit\natexit.register(torch.empty, 1 << 30, dtype=torch.uint8, device='cuda')\n", {0}, GIB),
        "sys.exit(main()) returns None": (JOB + "def main():\n  return None\nif __name__ == '__main__':\n"
                                          "  import sys; sys.exit(main())\n", {0}, GIB),
        "sys.exit(main()) returns a string": (JOB + "def main():\n  return 'failed: bad'\n"
                                              "if __name__ == '__main__':\n  import sys; sys.exit(main())\n", {1}, 0),
        "sys.exit(2**100)": (JOB + "import sys; sys.exit(2**100)\n", {1}, 0),
        "os._exit replaced after training": (JOB + "import os\nos._exit = lambda *a: None\n", {0}, GIB),
        "os.getpid constant after training": (JOB + "import os\nos.getpid = lambda: 1\n", {0}, GIB),
        "clocks NaN before torch": ("import time\ntime.monotonic = lambda: float('nan')\n"
                                    "time.perf_counter = lambda: float('nan')\ntime.time = lambda: -1.0\n" + JOB, {0}, GIB),
        "os.write raises after training": (JOB + "import os\ndef w(*a): raise OSError(5, 'no')\nos.write = w\n", {0}, GIB),
        "sys.exit None after training": (JOB + "import sys\nsys.exit = None\n", {0}, GIB),
        "Thread.start a no-op before torch": ("import threading\nthreading.Thread.start = lambda self: None\n" + JOB, {0}, GIB),
        "signal.signal a no-op before torch": ("import signal\nsignal.signal = lambda *a: None\n" + JOB, {0}, GIB),
        "peakmem's modules replaced in sys.modules": (
            "import sys, types\nfor k in list(sys.modules):\n  if k.startswith('peakmem'): "
            "sys.modules[k] = types.ModuleType(k)\n" + JOB, {3}, 0),
        # the capture cannot see these allocations: a clear failure, never a smaller peak
        "DisableTorchFunction around a device tensor": (
            JOB + "with torch._C.DisableTorchFunction():\n  y = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n", {1}, 0),
        "torch function mode stack popped": (
            JOB + "while torch._C._len_torch_function_stack():\n  torch._C._pop_torch_function_stack()\n"
            "y = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n", {3}, 0),
        "_disable_current_modes around a device tensor": (
            JOB + "from torch.utils._python_dispatch import _disable_current_modes\nwith _disable_current_modes():\n"
            "  y = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n", {0, 1}, 2 * GIB),
    }
    return [_case(f"job {label}", "tampering job", [*est, "train.py"], codes,
                  files={"train.py": body}, json_out=True, peak_at_least=peak,
                  job_traceback=True, job_stderr=True, timeout=300)
            for label, (body, codes, peak) in jobs.items()]


def cases() -> list:
    return job_forms() + tampering_jobs()


def run_one(case) -> dict:
    return run_guarded(case, materialise, check)


def main() -> int:
    return k5_main(cases, run_one)


if __name__ == "__main__":
    sys.exit(main())
