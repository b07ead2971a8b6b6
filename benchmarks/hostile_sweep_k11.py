"""Run the k11 adversarial sweep: hostile inputs none of the k5-k10 sweeps tries.

    PYTHONPATH=src python benchmarks/hostile_sweep_k11.py [--only SUBSTRING] [--jobs N]

Same contract and judge as k5 (`run_case`) with k6's to k8's extra checks (`json_out`,
`peak_at_least`, `stdout_has`, ...), run by the shared runner (hostile_sweep_common.py). Classes:
device work with peakmem's dispatch mode turned off (k9's open failure: `_disable_current_modes`,
`_pop_mode_temporarily`, `_DisableTorchDispatch`; capture.recorder_guard records it); sparse CSR /
CSC / COO device tensors made from dense ones and back (k10's open failures); module names that
are rich markup or hold line breaks / bidi overrides in the text report; jobs that turn off the
garbage collector over cycles holding device tensors, lower the recursion limit, raise from
`__getattr__` / `__repr__`, give parameters a `__torch_function__` subclass, set odd memory
fractions, record a memory history of 2^62 entries, dump snapshots to /dev/full or outside their
folder, delete their own script, make their folder read-only, flood stderr, exit inside a
DataLoader worker, replace sys.stdout, misuse CUDA graphs (`.item()` inside a capture fails as
CUDA fails it: "operation not permitted when stream is capturing"), raise from
`threading.excepthook`, load a checkpoint whose name is not UTF-8, make device storages directly
(`torch.UntypedStorage(n, device="cuda")`), export device tensors through DLPack or CUDA IPC
or make strided nested device tensors (unsupported, exit 3); `batch -o` paths that are
rich markup. Figures (`python benchmarks/hostile_sweep_k11.py --jobs 2 | tail -1`): 43 cases,
19 failures on main at 0d3e88b; 0 after this round's fixes.
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
MIB = 1 << 20
HOLD = "keep = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n"
JOB = TRAIN + HOLD
EST = ["estimate", "--json"]


def _case(name: str, surface: str, argv: list[str], codes: set[int] | int, **kw) -> Case8:
    codes = {codes} if isinstance(codes, int) else codes
    return Case8(name, surface, tuple(argv), frozenset(codes), **kw)


def _job(label: str, surface: str, body: str, codes: set[int] | int, peak: int = 0,
         argv: list[str] | None = None, **kw) -> Case8:
    return _case(f"job {label}", surface, argv or [*EST, "train.py"], codes,
                 files={"train.py": body}, json_out=argv is None, peak_at_least=peak,
                 job_traceback=True, job_stderr=True, timeout=kw.pop("timeout", 300), **kw)


def modes_off() -> list[Case8]:
    sub = "dispatch modes off"
    more = "  y = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n  z = y + 1\n"
    rows = {
        "_disable_current_modes": "from torch.utils._python_dispatch import _disable_current_modes as off\n",
        "_pop_mode_temporarily": "from torch.utils._python_dispatch import _pop_mode_temporarily as off\n",
        "torch._C._DisableTorchDispatch": "off = torch._C._DisableTorchDispatch\n",
    }
    out = [_job(f"{label} around two device GiB", sub, JOB + imp + "with off():\n" + more, {0}, 3 * GIB,
                stdout_has="recorded that work regardless")
           for label, imp in rows.items()]
    out.append(_job("_disable_current_modes in a thread", sub, JOB + rows["_disable_current_modes"]
                    + "import threading\ndef w():\n  global y, z\n  with off():\n  " + more.replace("\n  ", "\n    ")
                    + "t = threading.Thread(target=w); t.start(); t.join()\n", {0}, 3 * GIB))
    return out


def sparse() -> list[Case8]:
    sub = "sparse"
    dense = "d = torch.randn(1 << 13, 1 << 13, device='cuda')\n"  # 256 MiB of float32
    bound = "bounded from above"
    return [
        _job("to_sparse_csr() then csr @ x", sub, TRAIN + dense + "s = d.to_sparse_csr()\n"
             "y = s @ torch.randn(1 << 13, 8, device='cuda')\n", {0}, 1 << 30, stdout_has=bound),
        _job("to_sparse_csc()", sub, TRAIN + dense + "s = d.to_sparse_csc()\n", {0}, 1 << 30, stdout_has=bound),
        _job("to_sparse(layout=torch.sparse_csr)", sub, TRAIN + dense + "s = d.to_sparse(layout=torch.sparse_csr)\n",
             {0}, 1 << 30, stdout_has=bound),
        _job("zeros to_sparse() then to_dense()", sub, TRAIN + "s = torch.zeros(1 << 13, 1 << 13, device='cuda')"
             ".to_sparse()\nd = s.to_dense()\n", {0}, 1 << 30, stdout_has=bound),
        _job("sparse_csr_tensor on the device, sparse.mm", sub, TRAIN + "crow = torch.tensor([0, 1, 2], device='cuda')\n"
             "col = torch.tensor([0, 1], device='cuda')\n"
             "s = torch.sparse_csr_tensor(crow, col, torch.ones(2, device='cuda'), (2, 2), device='cuda')\n"
             "y = torch.sparse.mm(s, torch.randn(2, 4, device='cuda'))\n" + HOLD, {0}, GIB),
        _job("to_sparse_csr() of a 1-d tensor", sub, TRAIN + "s = torch.randn(8, device='cuda').to_sparse_csr()\n", {1}),
    ]


MODULES = ("import torch\nm = torch.nn.Sequential()\nm._modules[{name!r}] = torch.nn.Linear(8192, 8192)\n"
           "m = m.cuda()\nm(torch.randn(4, 8192, device='cuda')).sum().backward()\n")


def module_names() -> list[Case8]:
    sub = "module names"
    names = {"rich closing tag": "[/x]", "rich style markup": "[bold red]FITS[/bold red]",
             "newline": "a\nFits  yes", "bidi override and a surrogate": "\u202e\udcff"}
    return [_job(f"module named {label}, text report", sub, MODULES.format(name=name), {0},
                 argv=["estimate", "train.py"], stdout_not="\u202e") for label, name in names.items()]


def job_behaviour() -> list[Case8]:
    sub = "job behaviour"
    rows = {
        # (body, exit codes, peak at least)
        "gc.disable, cycles holding 8 x 256 MiB": (
            "import gc, torch\ngc.disable()\nfor i in range(8):\n  a = [torch.empty(1 << 28, dtype=torch.uint8, "
            "device='cuda')]\n  a.append(a)\n  del a\n" + TRAIN, {0}, 2 * GIB),
        "setrecursionlimit(100) before training": ("import sys\nsys.setrecursionlimit(100)\n" + JOB, {0}, GIB),
        "module __getattr__ and __repr__ raise": (
            TRAIN + "class M(torch.nn.Module):\n  def __init__(self):\n    super().__init__(); self.l = torch.nn.Linear(8192, 8192)\n"
            "  def forward(self, x): return self.l(x)\n  def __getattr__(self, n):\n"
            "    if n.startswith('_') or n == 'l': return super().__getattr__(n)\n    raise RuntimeError('no ' + n)\n"
            "  def __repr__(self): raise RuntimeError('repr')\nm = M().cuda()\nm(torch.randn(4, 8192, device='cuda')).sum().backward()\n",
            {0}, 512 * MIB),
        "parameter of a __torch_function__ subclass": (
            TRAIN + "class P(torch.nn.Parameter):\n  @classmethod\n  def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
            "    return super().__torch_function__(func, types, args, kwargs or {})\n"
            "l = torch.nn.Linear(8192, 8192)\nl.weight = P(l.weight.data)\nl = l.cuda()\n"
            "l(torch.randn(4, 8192, device='cuda')).sum().backward()\nassert isinstance(l.weight, P)\n", {0}, 512 * MIB),
        "memory fraction nan": (TRAIN + "torch.cuda.set_per_process_memory_fraction(float('nan'))\n" + HOLD, {1}, 0),
        "memory fraction 2.0": (TRAIN + "torch.cuda.set_per_process_memory_fraction(2.0)\n" + HOLD, {1}, 0),
        "memory fraction 0.0 then 1 GiB": (TRAIN + "torch.cuda.set_per_process_memory_fraction(0.0)\n" + HOLD, {0, 1}, 0),
        "record_memory_history max_entries 2^62": (
            TRAIN + "torch.cuda.memory._record_memory_history(max_entries=2**62)\n" + HOLD, {0}, GIB),
        "_dump_snapshot to /dev/full": (
            JOB + "torch.cuda.memory._record_memory_history()\nx = torch.ones(10, device='cuda')\n"
            "torch.cuda.memory._dump_snapshot('/dev/full')\n", {1}, 0),
        "_dump_snapshot outside its folder": (
            JOB + "import os, tempfile\ntorch.cuda.memory._record_memory_history()\n"
            "torch.cuda.memory._dump_snapshot(os.path.join(tempfile.mkdtemp(), 's.pickle'))\n", {0}, GIB),
        "deletes its own script": (TRAIN + "import os\nos.remove(__file__)\n" + HOLD, {0}, GIB),
        "makes its folder read-only": (TRAIN + "import os\nos.chmod('.', 0o555)\n" + HOLD, {0}, GIB),
        "50 MiB to stderr": (JOB + "import sys\nfor i in range(50): sys.stderr.write('x' * (1 << 20) + '\\n')\n", {0}, GIB),
        "os._exit in every DataLoader worker": (
            TRAIN + "import os\nclass D(torch.utils.data.Dataset):\n  def __len__(self): return 64\n"
            "  def __getitem__(self, i):\n    if torch.utils.data.get_worker_info() is not None: os._exit(3)\n"
            "    return torch.randn(16)\nfor b in torch.utils.data.DataLoader(D(), batch_size=4, num_workers=2):\n"
            "  model(b.cuda()).sum().backward()\n" + HOLD, {0, 1}, 0),
        "sys.stdout a BytesIO": (JOB + "import io, sys\nsys.stdout = io.BytesIO()\n", {0}, GIB),
        "sys.stdout an object, then print": (JOB + "import sys\nsys.stdout = object()\nprint('hi')\n", {1}, 0),
        "CUDAGraph capture_end without begin": (TRAIN + "g = torch.cuda.CUDAGraph()\ng.capture_end()\n", {1}, 0),
        "threading.excepthook raises": (
            JOB + "import threading\ndef h(a): raise RuntimeError('hook')\nthreading.excepthook = h\n"
            "t = threading.Thread(target=lambda: 1 / 0); t.start(); t.join()\n", {0}, GIB),
        "torch.load of a checkpoint named with a surrogate escape": (
            TRAIN + "sd = {'w\\udc80': torch.empty(1 << 29, dtype=torch.uint8, device='cuda')}\n"
            "torch.save(sd, 'sd\\udc80.pt')\nback = torch.load('sd\\udc80.pt')\nassert list(back) == list(sd)\n",
            {0}, GIB),
        "torch.UntypedStorage(1 GiB, device='cuda')": (
            TRAIN + "s = torch.UntypedStorage(1 << 30, device='cuda')\n", {0}, GIB),
        "TypedStorage on the device, a tensor set_ onto it": (
            TRAIN + "s = torch.TypedStorage(1 << 28, dtype=torch.float32, device='cuda')\n"
            "t = torch.empty(0, device='cuda').set_(s)\n", {0}, GIB),
        "torch.from_dlpack(to_dlpack(device tensor))": (
            JOB + "c = torch.utils.dlpack.to_dlpack(keep)\ny = torch.from_dlpack(c)\n", {3}, 0),
        "storage._share_cuda_() of a device tensor": (JOB + "h = keep.untyped_storage()._share_cuda_()\n", {3}, 0),
        "strided nested tensor of device tensors": (
            JOB + "n = torch.nested.nested_tensor([torch.randn(8, device='cuda'), torch.randn(4, device='cuda')])\n", {3}, 0),
        "jagged nested tensor of device tensors": (
            TRAIN + "n = torch.nested.nested_tensor([torch.randn(1 << 27, device='cuda')] * 2, layout=torch.jagged)\n"
            "m = n * 2\n", {0}, GIB),
        ".item() inside a CUDA graph capture": (
            TRAIN + "g = torch.cuda.CUDAGraph()\nx = torch.ones(4, device='cuda')\nwith torch.cuda.graph(g):\n"
            "  v = (x * 2).sum().item()\n", {1}, 0),
    }
    return [_job(label, sub, body, codes, peak) for label, (body, codes, peak) in rows.items()]


FAKE = "peakmem.service.estimators:fake_estimator"


def markup_paths() -> list[Case8]:
    """Paths the user names, printed by rich: `[/x]` is no markup."""
    jobs = '{"id": "a", "command": ["python", "t.py"]}\n'
    return [_case(f"batch -o {out!r}", "markup paths",
                  ["batch", "--in-process", "--estimator", FAKE, "-o", out, "jobs.jsonl"], {0},
                  files={"jobs.jsonl": jobs}, timeout=120)
            for out in ("r[/x].jsonl", "r[bold]x[/bold].jsonl", "[link=file:///etc]r[/link].jsonl")]


def cases() -> list:
    return modes_off() + sparse() + module_names() + job_behaviour() + markup_paths()


def run_one(case) -> dict:
    return run_guarded(case, materialise, check)


def main() -> int:
    return k5_main(cases, run_one)


if __name__ == "__main__":
    sys.exit(main())
