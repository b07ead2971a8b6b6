"""Run the k8 adversarial sweep: hostile inputs none of the k5, k6 or k7 sweeps tries.

    PYTHONPATH=src python benchmarks/hostile_sweep_k8.py [--only SUBSTRING] [--jobs N]

Same contract and judge as k5 (`run_case`) with k6's and k7's extra checks (`unchanged`,
`stdout_not`, `json_out`, `stdout_has`, `peak_at_least`; service cases as k7 runs them). Extra
check of this sweep: `stderr_first` (the text stderr must start with: no stray line before the
one error line). Classes: device tensors whose byte size overflows int64 or that no GPU holds,
device dtype oddities, CUDA graph / autocast / profiler contexts left open, jobs that print
peakmem-like JSON or run peakmem's API inside, 10^5 tiny device tensors; FIFOs, /proc files and
names with newlines or RTL marks as every subcommand's input; outputs that are FIFOs or the
jobs' own inputs; `fit` over 1..2^63-1; service bodies that are compressed or hold 10^5 unknown keys.
"""

from __future__ import annotations

import gzip
import json
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hostile_sweep_common import run_guarded  # noqa: E402
from hostile_sweep_k5 import TRAIN, _script  # noqa: E402
from hostile_sweep_k5 import main as k5_main  # noqa: E402
from hostile_sweep_k6 import materialise  # noqa: E402
from hostile_sweep_k7 import Case7  # noqa: E402
from hostile_sweep_k7 import check as k7_check  # noqa: E402
from hostile_sweep_k7 import run_one as k7_run_one  # noqa: E402

GIB = 1 << 30
FAKE = "peakmem.service.estimators:fake_estimator"


@dataclass(frozen=True)
class Case8(Case7):
    stderr_first: str = ""  # the text stderr must start with


def _case(name: str, surface: str, argv: list[str], codes: set[int] | int, **kw) -> Case8:
    codes = {codes} if isinstance(codes, int) else codes
    return Case8(name, surface, tuple(argv), frozenset(codes), **kw)


def check(case, root: Path, stdout: bytes, stderr: str) -> list[str]:
    problems = k7_check(case, root, stdout, stderr)
    first = getattr(case, "stderr_first", "")
    if first and not stderr.startswith(first):
        problems.append(f"stderr starts {stderr[:40]!r}, not {first!r}")
    return problems


def job_cases() -> list[Case8]:
    est = ["estimate", "--json"]
    overflow = "Storage size calculation overflowed"
    jobs = {
        # (body, exit codes, stdout must hold, peak_allocated_bytes at least)
        "device tensor of 2^62 float32 (2^64 bytes)":
            (TRAIN + "x = torch.empty(2**62, device='cuda')\n", {1}, overflow, 0),
        "device tensor of 2^61 float32 zeros (2^63 bytes)":
            (TRAIN + "x = torch.zeros(2**61, device='cuda')\n", {1}, overflow, 0),
        "device tensor of 2^62 + 1 float32 (wraps to 4 bytes)":
            (TRAIN + "x = torch.empty(2**62 + 1, device='cuda')\n", {1}, overflow, 0),
        "device empty_strided spanning 2^64 bytes":
            (TRAIN + "x = torch.empty_strided((2,), (2**62,), device='cuda')\n", {1}, overflow, 0),
        "device ones 2^30 x 2^30 x 4":
            (TRAIN + "x = torch.ones(2**30, 2**30, 4, device='cuda')\n", {1}, overflow, 0),
        "device tensor of 2^62 bytes":
            (TRAIN + "x = torch.empty(2**62, dtype=torch.uint8, device='cuda')\n", {0}, "", 2**62),
        "three device tensors of 2^62 bytes":
            (TRAIN + "k = [torch.empty(2**62, dtype=torch.uint8, device='cuda') for _ in range(3)]\n",
             {0}, "", 3 * 2**62),
        "device tensor of 2^63 - 1 bytes":
            (TRAIN + "x = torch.empty(2**63 - 1, dtype=torch.uint8, device='cuda')\n", {0}, "",
             2**63 - 1),
        "zero-size device tensor with a 10^12 dimension":
            (TRAIN + "x = torch.empty(0, 10**12, device='cuda'); y = x.sum(); z = x + 1\n", {0}, "", 0),
        "device dtypes complex float8 uint16-64 bool":
            (TRAIN + "for dt in [torch.complex64, torch.complex128, torch.complex32, torch.bool, "
             "torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2]:\n"
             "  x = torch.zeros(1000, dtype=dt, device='cuda')\n"
             "y = torch.randn(8, 8, dtype=torch.complex64, device='cuda') @ "
             "torch.randn(8, 8, dtype=torch.complex64, device='cuda')\n"
             "keep = torch.empty(1 << 30, dtype=torch.uint64, device='cuda')\n", {0}, "", 8 * GIB),
        "CUDA graph capture left open":
            (TRAIN + "g = torch.cuda.CUDAGraph()\ns = torch.cuda.Stream()\n"
             "s.wait_stream(torch.cuda.current_stream())\nwith torch.cuda.stream(s):\n"
             "  g.capture_begin()\n  y = model(torch.randn(4, 16, device='cuda'))\n", {0, 1}, "", 0),
        "autocast never exited":
            (TRAIN + "c = torch.autocast('cuda', dtype=torch.float16)\nc.__enter__()\n"
             "y = model(torch.randn(4, 16, device='cuda'))\n", {0}, "", 0),
        "profiler never stopped":
            (TRAIN + "p = torch.profiler.profile()\np.__enter__()\n"
             "y = model(torch.randn(4, 16, device='cuda'))\n", {0}, "", 0),
        "Tensor.__del__ raises":
            (TRAIN + "torch.Tensor.__del__ = lambda self: 1 / 0\nx = torch.empty(10, device='cuda')\n"
             "del x\n", {0}, "", 0),
        "prints estimate-like JSON on stdout":
            (TRAIN + "print('{\"peak_bytes\": 1, \"fits\": true}')\nimport sys\n"
             "sys.stdout.write('{\"error\": {\"kind\": \"x\"}}')\n"
             "keep = torch.empty(1 << 20, dtype=torch.uint8, device='cuda')\n", {0}, "", 1 << 20),
        "runs a capture of its own through peakmem's API":
            (TRAIN + "from peakmem.capture import capture_callable\n"
             "from peakmem.profiles import load_gpu, load_stack\n"
             "r = capture_callable(lambda: torch.empty(1 << 20, device='cuda'), "
             "gpu=load_gpu('a100-40gb'), stack=load_stack('2.4.1'))\nassert r.error is None\n"
             "keep = torch.empty(1 << 28, dtype=torch.uint8, device='cuda')\n", {0}, "", 1 << 28),
        "10^5 tiny device tensors":
            ("import torch\nkeep = [torch.empty(1, device='cuda') for _ in range(100_000)]\n",
             {0}, "", 100_000 * 512),
    }
    return [_case(f"job {label}", "device tensors", [*est, "train.py"], codes,
                  files=_script(body), json_out=True, stdout_has=has, peak_at_least=peak,
                  job_traceback=True, job_stderr=True, timeout=400)
            for label, (body, codes, has, peak) in jobs.items()]


def file_cases() -> list[Case8]:
    """Every subcommand's input file as a FIFO, a /proc file, a name with a newline or an RTL
    mark: one error line naming it, never a hang."""
    out = []
    jobs = b'{"id": "a", "command": ["python", "train.py"], "cwd": "."}\n'
    readers = {
        "simulate": ["simulate", "--json"], "replay": ["replay", "--json"],
        "pack": ["pack", "--json", "--gpus", "1xh100-80gb"],
        "pack --jobs": ["pack", "--json", "--gpus", "1xh100-80gb", "--jobs"],
        "batch": ["batch", "--in-process", "--json"],
    }
    for label, argv in readers.items():
        out.append(_case(f"{label} FIFO", "input files", [*argv, "f.jsonl"], 2,
                         files={"@fifo f.jsonl": ""}, json_out=True, stdout_has="is a FIFO",
                         timeout=30))
        for path in ["/proc/self/mem", "/proc/self/environ"]:
            out.append(_case(f"{label} {path}", "input files", [*argv, path], 2, json_out=True,
                             timeout=30))
        for name in ["a\nFAKE: b.jsonl", "\u202eevil\x1b[31m.jsonl"]:
            out.append(_case(f"{label} named {name!r}", "input files", [*argv, name], 2,
                             files={name: b"x\n"}, json_out=True, timeout=30))
    out.append(_case("batch /dev/null", "input files", ["batch", "--in-process", "--json", "/dev/null"],
                     2, json_out=True, stdout_has="is a device", timeout=30))
    out.append(_case("batch bad jobs: the error is stderr's first line", "input files",
                     ["batch", "--in-process", "bad.jsonl"], 2, files={"bad.jsonl": b"x\n"},
                     stderr_first="peakmem: error: bad.jsonl line 1", timeout=30))
    # outputs: a FIFO nobody reads, the jobs' own inputs
    out.append(_case("estimate --snapshot FIFO without a reader", "output files",
                     ["estimate", "--json", "--snapshot", "s.pickle", "train.py"], 2,
                     files={"train.py": TRAIN, "@fifo s.pickle": ""}, json_out=True,
                     stdout_has="a FIFO that no process reads", timeout=120))
    out.append(_case("estimate --timeline FIFO without a reader", "output files",
                     ["estimate", "--json", "--timeline", "t.html", "train.py"], 2,
                     files={"train.py": TRAIN, "@fifo t.html": ""}, json_out=True,
                     stdout_has="a FIFO that no process reads", timeout=120))
    named = b'{"id": "a", "command": ["python", "train.py", "--data", "data.txt"], "cwd": "."}\n'
    for target in ["train.py", "data.txt"]:
        out.append(_case(f"batch -o {target} (a job's input)", "output files",
                         ["batch", "--in-process", "--json", "--estimator", FAKE, "jobs.jsonl",
                          "-o", target], 2,
                         files={"jobs.jsonl": named if target == "data.txt" else jobs,
                                "train.py": TRAIN, "data.txt": "data\n"},
                         json_out=True, unchanged=("train.py", "data.txt"), timeout=60))
    return out


def service_cases() -> list[Case8]:
    job = {"files": {"train.py": "print('hi')\n"}, "command": ["python", "train.py"]}
    raw = {"content-type": "application/json"}
    keys = ",".join(f'"k{i}": 1' for i in range(100_000))
    rows = [
        ("body 10^5 unknown keys", "/v1/estimates",
         {"content": ("{" + keys + "}").encode(), "headers": raw}, "unknown field(s)"),
        ("options 10^5 unknown keys", "/v1/estimates",
         {"content": ('{"command": ["python", "train.py"], "options": {' + keys + "}}").encode(),
          "headers": raw}, "unknown field(s)"),
        ("gzip bomb with content-encoding gzip", "/v1/estimates",
         {"content": gzip.compress(b" " * (100 << 20)), "headers": {**raw, "content-encoding": "gzip"}},
         "not supported"),
        ("deflate body with content-encoding deflate", "/v1/estimates",
         {"content": zlib.compress(json.dumps(job).encode()),
          "headers": {**raw, "content-encoding": "deflate"}}, "not supported"),
        ("admission body gzip", "/v1/admission",
         {"content": gzip.compress(b"{}"), "headers": {**raw, "content-encoding": "gzip"}},
         "not supported"),
        ("header of 1 MB", "/v1/estimates", {"json": job, "headers": {"x-big": "a" * 1_000_000}}, ""),
    ]
    return [_case(f"service {label}", "service", [route], {0}, request=request, expect_text=text)
            for label, route, request, text in rows]


def fit_cases() -> list[Case8]:
    """fit over the widest range it takes, on a job whose peak grows with the value in the
    allocator's 2 MiB steps: the search must end in tens of estimates, not hundreds."""
    job = "import sys, torch\nx = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device='cuda')\n"
    return [_case("fit --arg b=1..2**63-1 on a job of b bytes", "fit",
                  ["fit", "--json", "--arg", "b=1..9223372036854775807", "--", "python",
                   "train.py", "{b}"], 0, files=_script(job), json_out=True, timeout=480)]


def cases() -> list:
    return job_cases() + file_cases() + fit_cases() + service_cases()


def run_one(case) -> dict:
    if getattr(case, "request", None) is not None:
        return k7_run_one(case)
    return run_guarded(case, materialise, check)


def main() -> int:
    return k5_main(cases, run_one)


if __name__ == "__main__":
    sys.exit(main())
