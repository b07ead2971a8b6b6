"""Run the k7 adversarial sweep: hostile inputs neither the k5 nor the k6 sweep tries.

    PYTHONPATH=src python benchmarks/hostile_sweep_k7.py [--only SUBSTRING] [--jobs N]

Same contract and judge as k5 (`run_case`) and k6's extra checks (`unchanged`, `stdout_not`,
`json_out`). Extra checks of this sweep: `absent` (paths, relative to the case's directory, that
must not exist after the run: an output written where the job moved, not where it was asked),
`peak_at_least` (the --json estimate's peak_allocated_bytes must be at least this: memory the
job holds must not be dropped) and `lines_of` (a file of the case that must hold so many JSON
lines after the run: a line glued to a torn one is not JSON).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hostile_sweep_common import JSON_ERRORS, run_guarded  # noqa: E402
from hostile_sweep_k5 import TRAIN, Case, _script  # noqa: E402
from hostile_sweep_k5 import main as k5_main  # noqa: E402
from hostile_sweep_k6 import check as k6_check  # noqa: E402
from hostile_sweep_k6 import materialise  # noqa: E402

GIB = 1 << 30
FAKE = "peakmem.service.estimators:fake_estimator"


@dataclass(frozen=True)
class Case7(Case):
    stdout_has: str = ""  # a text stdout must hold (a note the estimate must give)
    stdout_not: str = ""
    json_out: bool = False
    unchanged: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    peak_at_least: int = 0
    lines_of: tuple[str, int] | None = None
    request: dict | None = None  # service cases: requests.post kwargs, argv[0] the route
    expect_text: str = ""  # service cases: a text the answer must hold


def _case(name: str, surface: str, argv: list[str], codes: set[int] | int, **kw) -> Case7:
    codes = {codes} if isinstance(codes, int) else codes
    return Case7(name, surface, tuple(argv), frozenset(codes), **kw)


def check(case: Case, root: Path, stdout: bytes, stderr: str) -> list[str]:
    problems = k6_check(case, root, stdout, stderr)
    text = stdout.decode(errors="replace")
    if getattr(case, "json_out", False):
        try:
            if isinstance(json.loads(text).get("error"), dict):
                JSON_ERRORS.add(case.name)
        except (ValueError, AttributeError):
            pass
    if getattr(case, "stdout_has", "") and case.stdout_has not in text:
        problems.append(f"stdout lacks {case.stdout_has!r}")
    for name in getattr(case, "absent", ()):
        if (root / name).exists():
            problems.append(f"{name} was written")
    need = getattr(case, "peak_at_least", 0)
    if need:
        try:
            peak = json.loads(stdout.decode(errors="replace")).get("peak_allocated_bytes") or 0
        except (ValueError, AttributeError):
            peak = 0
        if peak < need:
            problems.append(f"peak_allocated_bytes {peak} < {need}")
    lines_of = getattr(case, "lines_of", None)
    if lines_of:
        name, count = lines_of
        lines = (root / name).read_bytes().split(b"\n") if (root / name).exists() else []
        lines = [line for line in lines if line.strip()]
        bad = 0
        for line in lines:
            try:
                json.loads(line.decode("utf-8", errors="replace").removeprefix("\ufeff"))
            except ValueError:
                bad += 1
        if len(lines) - bad != count:
            problems.append(f"{name}: {len(lines) - bad} JSON lines, want {count}")
    return problems


def job_cases() -> list[Case7]:
    est = ["estimate"]
    out = []
    after = {
        # resource limits and priority the job lowers for itself after training
        "RLIMIT_AS 300 MB after training": (TRAIN + "import resource\nresource.setrlimit(resource.RLIMIT_AS, (300 << 20, resource.RLIM_INFINITY))\n", {0, 1}),
        "RLIMIT_NPROC 0 after training": (TRAIN + "import resource\nresource.setrlimit(resource.RLIMIT_NPROC, (0, 0))\n", {0}),
        "RLIMIT_STACK small after training": (TRAIN + "import resource\nresource.setrlimit(resource.RLIMIT_STACK, (1 << 16, resource.RLIM_INFINITY))\n", {0}),
        "os.nice 19": (TRAIN + "import os\nos.nice(19)\n", {0}),
        "setrecursionlimit 40 then a normal end": (TRAIN + "import sys\nsys.setrecursionlimit(40)\n", {0}),
        "gc.disable and gc.freeze": ("import gc\ngc.disable()\n" + TRAIN + "gc.freeze()\n", {0}),
        "settrace counting left set": ("import sys, threading\nn = [0]\ndef t(f, e, a):\n  n[0] += 1\n  return t\nsys.settrace(t)\nthreading.settrace(t)\n" + TRAIN, {0}),
        "setprofile raising from threads": (TRAIN + "import threading\ndef p(*a): raise RuntimeError('prof')\nthreading.setprofile(p)\n", {0, 1}),
        "warnings.showwarning raises": ("import warnings\ndef s(*a, **k): raise RuntimeError('warned')\nwarnings.showwarning = s\nwarnings.simplefilter('always')\n" + TRAIN, {0, 1}),
        "warnings error and a deprecated torch call": ("import warnings\nwarnings.simplefilter('error')\n" + TRAIN + "torch.cuda.amp.GradScaler()\n", {0, 1}),
        "sys.argv emptied": (TRAIN + "import sys\nsys.argv = []\n", {0}),
        "sys.argv not a list": (TRAIN + "import sys\nsys.argv = None\n", {0}),
        "__main__ removed": (TRAIN + "import sys\ndel sys.modules['__main__']\n", {0}),
        "sys.path emptied": (TRAIN + "import sys\nsys.path[:] = []\n", {0}),
        "sigmask blocks everything then spins": (TRAIN + "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, set(signal.Signals) - {signal.SIGKILL, signal.SIGSTOP})\nwhile True: pass\n", {124}),
        "own process group then spins": (TRAIN + "import os\nos.setpgid(0, 0)\nwhile True: pass\n", {124}),
        "own session then spins": (TRAIN + "import os\nos.setsid()\nwhile True: pass\n", {124}),
        "alarm with default action": (TRAIN + "import signal\nsignal.alarm(1)\nimport time\ntime.sleep(5)\n", {1}),
        "imports peakmem": ("import peakmem, peakmem.cli.main\n" + TRAIN, {0}),
        "runs peakmem's CLI in process": (TRAIN + "from peakmem.cli.main import main\ntry:\n  main(['--help'], standalone_mode=False)\nexcept SystemExit:\n  pass\n", {0}),
        "multiprocessing fork child outlives it": (TRAIN + "import multiprocessing as mp, time, os\nmp.set_start_method('fork')\np = mp.Process(target=time.sleep, args=(600,), daemon=True)\np.start()\nos._exit(0)\n", {0}),
        "multiprocessing spawn child": (TRAIN + "import multiprocessing as mp\ndef f():\n  pass\nif __name__ == '__main__':\n  mp.set_start_method('spawn')\n  p = mp.Process(target=f)\n  p.start(); p.join()\n  assert p.exitcode == 0, p.exitcode\n", {0}),
        "popen grandchild holds the pipes": (TRAIN + "import subprocess\nsubprocess.Popen(['sleep', '600'])\n", {0}),
        "environ PYTHONPATH cleared": (TRAIN + "import os\nos.environ['PYTHONPATH'] = ''\nos.environ['PATH'] = ''\n", {0}),
        "stdio fds 0-2 closed": (TRAIN + "import os\nfor fd in (0, 1, 2): os.close(fd)\n", {0}),
        "stdio fds 0-2 closed then raise": (TRAIN + "import os\nfor fd in (0, 1, 2): os.close(fd)\nraise ValueError('v')\n", {1}),
    }
    for label, (body, codes) in after.items():
        timeout_flag = ["--timeout", "10"] if 124 in codes else []
        out.append(_case(f"job {label}", "tampering job", [*est, *timeout_flag, "train.py"], codes,
                         files=_script(body), job_traceback=True, timeout=150))
    # memory a job holds that python's own run would hold: must count
    thread_late = ("import torch, threading, time\n"
                   "keep = []\n"
                   "def late():\n  time.sleep(0.5)\n  keep.append(torch.empty(1 << 30, dtype=torch.uint8, device='cuda'))\n"
                   "  torch.cuda.synchronize()\n"
                   "threading.Thread(target=late).start()\n" + TRAIN)
    out.append(_case("job allocates from a thread after the main thread ends", "tampering job",
                     [*est, "--json", "train.py"], {0}, files=_script(thread_late), json_out=True,
                     peak_at_least=GIB, timeout=150))
    env_conf = "import os\nos.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n" + TRAIN
    out.append(_case("job sets PYTORCH_CUDA_ALLOC_CONF before importing torch", "tampering job",
                     [*est, "--json", "train.py"], {0}, files=_script(env_conf), json_out=True,
                     stdout_has="the job set its allocator configuration itself", timeout=150))
    # outputs named relative to the caller's directory, the job moves away and removes things
    moving = "import os\n" + TRAIN + "os.makedirs('elsewhere', exist_ok=True)\nos.chdir('elsewhere')\n"
    for flag, name in [("--job-log", "log.txt"), ("--snapshot", "s.pickle"), ("--timeline", "t.html")]:
        out.append(_case(f"job chdir, then {flag} relative", "tampering job",
                         [*est, flag, name, "train.py"], {0}, files=_script(moving),
                         absent=(f"elsewhere/{name}",), timeout=150))
    rm_dir = ("import os, shutil\n" + TRAIN + "shutil.rmtree(os.path.dirname(os.path.abspath(__file__)))\n")
    out.append(_case("job removes its own directory", "tampering job", [*est, "job/train.py"], {0},
                     files={"job/train.py": rm_dir}, timeout=150))
    out.append(_case("job removes its own directory with --job-log inside", "tampering job",
                     [*est, "--job-log", "job/log.txt", "job/train.py"], {0, 1, 2},
                     files={"job/train.py": rm_dir}, timeout=150))
    return out


def batch_cases() -> list[Case7]:
    """batch's results file (its resume state) as a crash, an editor or another run left it."""
    out = []
    job = {"id": "a", "command": ["python", "train.py"], "cwd": "."}
    jobs = (json.dumps(job) + "\n" + json.dumps({**job, "id": "b"}) + "\n").encode()
    done = {"id": "a", "status": "done", "result": {"peak_bytes": 1}, "error": None, "key": "k",
            "attempts": 1, "seconds": 0.1, "retryable": False}
    base = ["batch", "--in-process", "--estimator", FAKE, "--json", "jobs.jsonl"]
    results = {
        # (results file, lines it must hold after the run)
        "truncated last line": (json.dumps(done).encode() + b'\n{"id": "b", "stat', 2),
        "truncated, no newline at all": (json.dumps(done).encode(), 2),
        "duplicate ids": ((json.dumps(done) + "\n") .encode() * 3, 4),
        "a line for a job not in the list": ((json.dumps({**done, "id": "zzz"}) + "\n").encode(), 3),
        "done without a result": (b'{"id": "a", "status": "done"}\n', 3),
        "done with a result that is not an object": (b'{"id": "a", "status": "done", "result": 5}\n', 3),
        "id not a string": (b'{"id": 5, "status": "done", "result": {}}\n', 3),
        "NaN and non-utf8": (b'{"id": "a", "status": "done", "result": {"x": NaN}, "z": "\xff"}\n', 2),
        "NUL bytes": (b"\x00" * 4096 + b"\n", 3),
        "nested line": (b"[" * 200000 + b"\n", 3),
        "CRLF lines": ((json.dumps(done) + "\r\n").encode(), 2),
        "BOM": (b"\xef\xbb\xbf" + (json.dumps(done) + "\n").encode(), 2),
        "one 64 MB line": (b"x" * (64 << 20), 3),
    }
    for label, (body, count) in results.items():
        out.append(_case(f"batch results {label}", "batch results", base, {0},
                         files={"jobs.jsonl": jobs, "train.py": TRAIN,
                                "jobs.results.jsonl": body}, json_out=True,
                         lines_of=None if body.startswith((b"\x00", b"[", b"x")) else ("jobs.results.jsonl", count),
                         timeout=60))
    out.append(_case("batch results sparse 2 GB, no newline", "batch results", base, {0, 2},
                     files={"jobs.jsonl": jobs, "train.py": TRAIN,
                            "@sparse jobs.results.jsonl": str(2 * GIB)}, json_out=True, timeout=60))
    out.append(_case("batch results a symlink loop", "batch results", base, {2},
                     files={"jobs.jsonl": jobs, "train.py": TRAIN,
                            "@symlink jobs.results.jsonl": "jobs.results.jsonl"}, json_out=True, timeout=60))
    out.append(_case("batch results dangling symlink", "batch results", base, {0, 2},
                     files={"jobs.jsonl": jobs, "train.py": TRAIN,
                            "@symlink jobs.results.jsonl": "gone/r.jsonl"}, json_out=True, timeout=60))
    return out


def option_cases() -> list[Case7]:
    """Each subcommand's options with odd values the k5 and k6 sweeps do not give."""
    out = []
    ok = _script(TRAIN)
    trace = '{"format": "peakmem-trace", "version": 1, "meta": {}, "tags": []}\n[0, 1, 512, 0, -1]\n'
    jobs = b'{"id": "a", "command": ["python", "train.py"], "cwd": "."}\n'
    for flag, value in [("--device", "99999999999999999999"), ("--device", "5"),
                        ("--alloc-conf", "expandable_segments:maybe"), ("--alloc-conf", "\udcff"),
                        ("--capacity", "-1"), ("--capacity", "1e999"), ("--torch", "nan")]:
        out.append(_case(f"replay {flag} {value[:20]!r}", "replay flags",
                         ["replay", "--json", flag, value, "s.pickle"], {2}, json_out=True,
                         files={"s.pickle": __import__("pickle").dumps({"segments": [], "device_traces": [[]]})}))
    for value in ["expandable_segments:maybe", "\udcff", "x" * 100000, "max_split_size_mb:nan"]:
        out.append(_case(f"simulate --alloc-conf {value[:20]!r}", "simulate flags",
                         ["simulate", "--json", "--alloc-conf", value, "t.jsonl"], {2}, json_out=True,
                         files={"t.jsonl": trace}))
    for flag, value in [("--workers", "0"), ("--workers", "nan"), ("--max-seconds", "nan"),
                        ("--max-seconds", "inf"), ("--max-host-memory", "nan"),
                        ("--max-host-memory", "-1GiB"), ("--estimator", "nocolon"),
                        ("--estimator", ":"),
                        ("--estimator", "peakmem.service.estimators:NOPE"), ("--job-nice", "-5"),
                        ("-o", "")]:
        out.append(_case(f"batch {flag} {value!r}", "batch flags",
                         ["batch", "--in-process", "--json", flag, value, "jobs.jsonl"], {2},
                         files={"jobs.jsonl": jobs, "train.py": TRAIN}, json_out=True, timeout=60))
    for value in ["", "os;rm", "../x", "no_such_module_k7", "-m", "sys"]:
        out.append(_case(f"warm --preload {value!r}", "warm",
                         ["warm", "--json", "--idle", "1", "--preload", value], {2}, json_out=True,
                         env={"PEAKMEM_RUNTIME_DIR": "rt"}, files={"rt/.keep": ""}, timeout=60))
    for key, value in [("gpucores", "nan"), ("gpucores", "-1"), ("gpucores", "9" * 40),
                       ("fraction", "maybe"), ("mig", "zzz"), ("mig", ""), ("queue", "")]:
        for fmt in ["hami", "k8s-mig", "volcano"]:
            out.append(_case(f"estimate --emit {fmt} {key}={value[:12]!r}", "emit options",
                             ["estimate", "--json", "--emit", fmt, "--emit-option", f"{key}={value}",
                              "train.py"], {0, 2}, files=ok, json_out=True, timeout=120))
    for flag, value in [("--port", "99999"), ("--host", "no.such.host.invalid"),
                        ("--admission-budget", "nan"), ("--max-queue", "-1"),
                        ("--admission-workdir", "/dev/null"), ("--emit", ""),
                        ("--max-seconds", "nan")]:
        out.append(_case(f"serve {flag} {value!r}", "serve flags", ["serve", flag, value], {2},
                         timeout=30))
    for flag, value in [("--limit", "0"), ("--limit", "-1"), ("--jobs", "0"), ("--metric", "zzz"),
                        ("--estimators", "peakmem,peakmem")]:
        out.append(_case(f"bench {flag} {value!r}", "bench flags",
                         ["bench", "gpumemnet-mlp1", "--data", "data", flag, value], {2},
                         files={"data/.keep": ""}, timeout=60))
    for flag, value in [("--mode", "zzz"), ("--steps", "ALL"), ("--steps", "nan"), ("--timeout", "nan"),
                        ("--alloc-conf", "expandable_segments:maybe"), ("--torch", "nan")]:
        out.append(_case(f"fit {flag} {value!r}", "fit flags",
                         ["fit", "--json", flag, value, "--arg", "batch=1..2", "--", "python", "train.py",
                          "--batch", "{}"], {0, 1, 2} if value == "ALL" else {2}, files=ok, json_out=True,
                         timeout=120))
    for flag, value in [("--snapshot-stacks", "zzz"), ("--out", "/dev/full"), ("--snapshot", "."),
                        ("--device-index", "-1")]:
        out.append(_case(f"measure {flag} {value!r}", "measure flags",
                         ["measure", "--json", flag, value, "train.py"], {2, 3}, files=ok,
                         json_out=True, timeout=60))
    return out


def service_cases() -> list[Case7]:
    """The service and its webhook, in process (as hostile_service_k5.py), on bodies k5's service
    sweep does not send. A case fails on a 5xx, an exception, over 20 s, or an answer without
    its `expect_text`."""
    def pod(annotations: dict) -> dict:
        return {"metadata": {"annotations": annotations, "namespace": "ns"},
                "spec": {"containers": [{"name": "c", "image": "i"}]}}

    def review(request: dict, version: str = "admission.k8s.io/v1") -> dict:
        return {"apiVersion": version, "kind": "AdmissionReview", "request": request}

    cmd = {"peakmem.io/command": "python -m json.tool"}
    job = {"files": {"train.py": "print('hi')\n"}, "command": ["python", "train.py"]}
    raw = {"content-type": "application/json"}
    zipped = __import__("hostile_service_k5")._zip({"train.py": b"x"})
    rows = [
        ("annotation command one 5 MB word", "/v1/admission",
         {"json": review({"uid": "u", "object": pod({"peakmem.io/command": "python " + "x" * 5_000_000})})},
         "characters long"),
        ("annotation command 100 kB word", "/v1/admission",
         {"json": review({"uid": "u", "object": pod({"peakmem.io/command": "python " + "x" * 100_000})})}, ""),
        ("archive command one 1 MB word", "/v1/estimate-archives",
         {"files": {"archive": ("a.zip", zipped)}, "data": {"command": "python " + "x" * 1_000_000}},
         "characters long"),
        ("AdmissionReview v1beta1", "/v1/admission",
         {"json": review({"uid": "u", "object": pod(cmd)}, "admission.k8s.io/v1beta1")},
         '"apiVersion":"admission.k8s.io/v1beta1"'),
        ("AdmissionReview apiVersion int", "/v1/admission",
         {"json": {"apiVersion": 5, "kind": "AdmissionReview", "request": {"uid": "u", "object": pod(cmd)}}},
         '"apiVersion":"admission.k8s.io/v1"'),
        ("annotation options steps negative", "/v1/admission",
         {"json": review({"uid": "u", "object": pod(cmd | {"peakmem.io/options": '{"steps": -1}'})})},
         "peakmem.io/options: steps"),
        ("annotation options timeout 1e300", "/v1/admission",
         {"json": review({"uid": "u", "object": pod(cmd | {"peakmem.io/options": '{"timeout": 1e300}'})})},
         "peakmem.io/options: timeout"),
        ("annotation options duplicate key", "/v1/admission",
         {"json": review({"uid": "u", "object": pod(cmd | {"peakmem.io/options": '{"steps": 1, "steps": 2}'})})},
         "appears twice"),
        ("annotation options mode unknown", "/v1/admission",
         {"json": review({"uid": "u", "object": pod(cmd | {"peakmem.io/options": '{"mode": "zzz"}'})})},
         "peakmem.io/options: mode"),
        ("uid 2 MB", "/v1/admission", {"json": review({"uid": "u" * 2_000_000, "object": pod(cmd)})}, ""),
        ("annotations 200000", "/v1/admission",
         {"json": review({"uid": "u", "object": pod({f"a{i}": "x" for i in range(200000)} | cmd)})}, ""),
        ("annotation value null", "/v1/admission", {"json": review({"uid": "u", "object": pod({"peakmem.io/command": None})})}, ""),
        ("initContainers only", "/v1/admission",
         {"json": review({"uid": "u", "object": {"metadata": {"annotations": cmd}, "spec": {"initContainers": [{"name": "c"}]}}})},
         "no containers"),
        ("admission content-type yaml", "/v1/admission",
         {"content": json.dumps(review({"uid": "u", "object": pod(cmd)})).encode(), "headers": {"content-type": "application/yaml"}}, ""),
        ("admission content-encoding gzip, plain body", "/v1/admission",
         {"content": json.dumps(review({"uid": "u", "object": pod(cmd)})).encode(), "headers": {**raw, "content-encoding": "gzip"}}, ""),
        ("admission body utf-16", "/v1/admission",
         {"content": json.dumps(review({"uid": "u", "object": pod(cmd)})).encode("utf-16"), "headers": raw}, ""),
        ("admission body a string", "/v1/admission", {"content": b'"x"', "headers": raw}, ""),
        ("estimates command 1M words", "/v1/estimates", {"json": {**job, "command": ["python", "train.py"] + ["x"] * 1_000_000}}, ""),
        ("estimates file 60 MB", "/v1/estimates", {"json": {**job, "files": {"train.py": "x" * 60_000_000}}}, ""),
    ]
    return [_case(f"service {label}", "service", [route], {0}, request=request, expect_text=text)
            for label, route, request, text in rows]


_CLIENT: list = []
_CLIENT_LOCK = __import__("threading").Lock()


def run_service_case(case: Case7) -> dict:
    """One service case on an app with the fake estimator (made once, used under a lock)."""
    from hostile_service_k5 import post_case

    with _CLIENT_LOCK:
        if not _CLIENT:
            from fastapi.testclient import TestClient

            from peakmem.service.admission import AdmissionConfig
            from peakmem.service.app import ServiceConfig, create_app
            from peakmem.service.estimators import fake_estimator

            app = create_app(ServiceConfig(sandbox="off", workers=1,
                                           admission=AdmissionConfig(budget_seconds=2)),
                             estimator=fake_estimator)
            client = TestClient(app, raise_server_exceptions=False)
            client.__enter__()
            _CLIENT.append(client)
        status, text, seconds, problems = post_case(_CLIENT[0], case.argv[0], case.request)
    if case.expect_text and case.expect_text not in text:
        problems.append(f"answer lacks {case.expect_text!r}")
    return {"name": case.name, "surface": case.surface, "exit": status, "lines": 0,
            "traceback": False, "seconds": round(seconds, 1), "problems": problems,
            "last": " ".join(text.split())[:160], "stdout_bytes": len(text)}


def cases() -> list:
    return job_cases() + batch_cases() + option_cases() + service_cases()


def run_one(case: Case) -> dict:
    """A service case in process, any other by the shared runner."""
    if getattr(case, "request", None) is not None:
        return run_service_case(case)
    return run_guarded(case, materialise, check)


def main() -> int:
    return k5_main(cases, run_one)


if __name__ == "__main__":
    sys.exit(main())
