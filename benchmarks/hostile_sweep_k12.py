"""Run the k12 adversarial sweep: hostile inputs none of the k5-k11 sweeps tries.

    PYTHONPATH=src python benchmarks/hostile_sweep_k12.py [--only SUBSTRING] [--jobs N]

Same contract and judge as k5 (`run_case`) with k6's to k8's extra checks (`json_out`,
`peak_at_least`, `stdout_has`, ...), run by the shared runner (hostile_sweep_common.py). Classes:
device tensors made with peakmem's torch-function mode turned off (k11's open case:
`torch._C.DisableTorchFunction`, `torch.overrides._pop_mode_temporarily`; unsupported, exit 3);
`as_strided` views past their storage (CUDA refuses them, the meta kernel did not) and inside it;
`estimate --timeline` paths that are rich markup (text report); `--gpu` names of 10 kB or with
line breaks and bidi overrides; jobs that take peakmem's time limit apart (cancel its interval
timer, ignore or block SIGALRM, then spin: the parent's limit still ends them, exit 124), make
tensors of 2^31 + 1 and 2^40 elements, replace `torch.Tensor.__del__` or `torch.cuda` functions,
read /proc/self/maps and run nvidia-smi, use `sys.monitoring` (3.12+; skipped on 3.11), leave a
grandchild running, install a profile function (and a line tracer: peakmem cannot end the loop
early then, and says so) that reads `f_lineno` around a loop past the step limit, `set_` a device
tensor onto a host storage, or give `as_strided` negative strides.
Figures (`python benchmarks/hostile_sweep_k12.py --jobs 2 | tail -1`): 25 cases, 7 failures on
main at bb8b36b (PYTHONPATH=/work/main/src, run as five `--only SURFACE` runs: torch-function
mode off 3, as_strided 2, markup paths 1, gpu names 1, job behaviour 0); 0 after this round's
fixes.
"""

from __future__ import annotations

import sys
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
EST = ["estimate", "--json"]
SPIN_LIMIT = ["--timeout", "60"]


def _case(name: str, surface: str, argv: list[str], codes: set[int] | int, **kw) -> Case8:
    codes = {codes} if isinstance(codes, int) else codes
    return Case8(name, surface, tuple(argv), frozenset(codes), **kw)


def _job(label: str, surface: str, body: str, codes: set[int] | int, peak: int = 0,
         argv: list[str] | None = None, **kw) -> Case8:
    return _case(f"job {label}", surface, argv or [*EST, "train.py"], codes,
                 files={"train.py": body}, json_out=argv is None or "--json" in argv,
                 peak_at_least=peak, job_traceback=True, job_stderr=True,
                 timeout=kw.pop("timeout", 400), **kw)


def torch_function_off() -> list[Case8]:
    sub = "torch-function mode off"
    said = "torch-function mode turned off"
    tf_off = "with torch._C.DisableTorchFunction():\n"
    popped = "from torch.overrides import _pop_mode_temporarily\nwith _pop_mode_temporarily():\n"
    return [
        _job("DisableTorchFunction around torch.empty(device='cuda')", sub,
             JOB + tf_off + "  y = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n", {3},
             stdout_has=said),
        _job("DisableTorchFunction around x.cuda()", sub, JOB + tf_off + "  y = torch.ones(4).cuda()\n",
             {3}, stdout_has=said),
        _job("torch.overrides._pop_mode_temporarily around torch.ones(device='cuda')", sub,
             JOB + popped + "  y = torch.ones(4, device='cuda')\n", {3}, stdout_has=said),
        _job("DisableTorchFunction around an op on a held device tensor", sub,
             JOB + tf_off + "  y = keep + 1\n", {0}, 2 * GIB),
    ]


def strided() -> list[Case8]:
    sub = "as_strided"
    x = "x = torch.empty(10, device='cuda')\n"
    return [
        _job("as_strided 10^6 elements over 10", sub, JOB + x + "y = x.as_strided((1000000,), (1,))\n", {1},
             stdout_has="out of bounds for storage of size 40"),
        _job("as_strided offset past the end", sub, JOB + x + "y = x.as_strided((5,), (1,), 6)\n", {1},
             stdout_has="out of bounds for storage of size 40"),
        _job("as_strided inside, zero-size at offset 2^40", sub,
             JOB + x + "y = x.as_strided((5,), (2,))\nz = x.as_strided((0,), (1,), 1 << 40)\n", {0}, GIB),
        _job("as_strided negative stride", sub, JOB + x + "y = x.as_strided((10,), (-1,))\n", {1},
             stdout_has="Negative strides are not supported"),
        _job("set_ a device tensor onto a host storage", sub,
             JOB + "t = torch.empty(0, device='cuda').set_(torch.empty(10).untyped_storage())\n", {1}),
    ]


def markup_and_names() -> list[Case8]:
    out = [_case(f"estimate --timeline {name!r}, text report", "markup paths",
                 ["estimate", "--timeline", name, "train.py"], {0},
                 files={"train.py": TRAIN, "t[/.keep": ""}, stdout_has="timeline written to",
                 job_stderr=True, timeout=400)
           for name in ("t[/x].html", "t[bold].html")]
    for label, name in (("10 kB", "h" * 10_000), ("newline, bidi, markup", "h200\u202e\n[/x]")):
        out.append(_case(f"--gpu {label}", "gpu names", [*EST, "--gpu", name, "train.py"], {2},
                         files={"train.py": TRAIN}, json_out=True, stdout_has="known GPUs: a100",
                         timeout=120))
    return out


def job_behaviour() -> list[Case8]:
    sub = "job behaviour"
    spin = "while True: pass\n"
    rows = {
        # (body, exit codes, peak at least, extra argv)
        "cancels the interval timer, then spins": (
            TRAIN + "import signal\nsignal.setitimer(signal.ITIMER_REAL, 0)\n" + spin, {124}, 0, SPIN_LIMIT),
        "ignores SIGALRM, then spins": (
            TRAIN + "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n" + spin, {124}, 0, SPIN_LIMIT),
        "blocks SIGALRM only, then spins": (
            TRAIN + "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\n" + spin,
            {124}, 0, SPIN_LIMIT),
        "tensor of 2^31 + 1 elements, made float": (
            TRAIN + "x = torch.empty(2**31 + 1, dtype=torch.uint8, device='cuda')\ny = x.float()\n",
            {0}, 10 * GIB, []),
        "tensor of 2^40 bytes": (TRAIN + "x = torch.empty(2**40, dtype=torch.uint8, device='cuda')\n",
                                 {0}, 1 << 40, []),
        "replaces torch.Tensor.__del__": (
            TRAIN + "torch.Tensor.__del__ = lambda self: None\n" + HOLD + "del keep\n" + HOLD, {0}, GIB, []),
        "replaces torch.cuda functions": (
            TRAIN + "torch.cuda.memory_allocated = lambda *a: 0\ntorch.cuda.synchronize = None\n"
            "torch.cuda.empty_cache = 1\n" + HOLD, {0}, GIB, []),
        "reads /proc/self/maps and runs nvidia-smi": (
            TRAIN + "assert open('/proc/self/maps').read()\nimport subprocess\n"
            "subprocess.run(['nvidia-smi', '--query-gpu=memory.total', '--format=csv'], capture_output=True)\n"
            + HOLD, {0}, GIB, []),
        "sys.monitoring where python has it": (
            TRAIN + "import sys\nif hasattr(sys, 'monitoring'):\n  sys.monitoring.use_tool_id(3, 'x')\n"
            "  sys.monitoring.set_events(3, sys.monitoring.events.PY_START)\n"
            "  sys.monitoring.register_callback(3, sys.monitoring.events.PY_START, lambda *a: None)\n" + HOLD,
            {0}, GIB, []),
        "grandchild outlives it and prints": (
            TRAIN + "import os, time\nif os.fork() == 0:\n  if os.fork() == 0:\n    time.sleep(3); print('GRANDCHILD')\n"
            "    os._exit(0)\n  os._exit(0)\n" + HOLD, {0}, GIB, []),
        "profile function reading f_lineno around a loop past the step limit": (
            PROFILE + TRAIN + LOOP + HOLD, {0}, GIB, []),
    }
    out = [_job(label, sub, body, codes, peak, argv=[*EST, *extra, "train.py"],
                stdout_not="GRANDCHILD")
           for label, (body, codes, peak, extra) in rows.items()]
    # the job's own line tracer: peakmem cannot end its loop early, stops at the step limit and
    # says that what follows the loop did not run (no silent low peak)
    out.append(_job("profile and line tracer reading f_lineno around a loop past the step limit",
                    sub, PROFILE + TRACER + TRAIN + LOOP + HOLD, {0},
                    stdout_has="could not be ended early: a trace function"))
    return out


PROFILE = "import sys\ndef p(f, e, a):\n  f.f_lineno\n  return p\nsys.setprofile(p)\n"
TRACER = "def t(f, e, a):\n  f.f_lineno\n  return t\nsys.settrace(t)\n"
LOOP = "for i in range(5):\n  model(torch.randn(4, 16, device='cuda')).sum().backward(); opt.step()\n"


def cases() -> list:
    return torch_function_off() + strided() + markup_and_names() + job_behaviour()


def run_one(case) -> dict:
    return run_guarded(case, materialise, check)


def main() -> int:
    return k5_main(cases, run_one)


if __name__ == "__main__":
    sys.exit(main())
