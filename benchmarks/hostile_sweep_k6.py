"""Run the k6 adversarial sweep: hostile inputs the k5 sweep (hostile_sweep_k5.py) does not try.

    PYTHONPATH=src python benchmarks/hostile_sweep_k6.py [--only SUBSTRING] [--jobs N]

Same contract and judge as k5 (`run_case`): an exit status from the case's allowed set, one
`peakmem` line on stderr for a refused input, no peakmem traceback, no timeout, never exit 70.
Extra checks of this sweep: `outside` (a file the case names must not exist after the run) and
`stdout` (a text the output must not hold, e.g. an injected directive).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hostile_sweep_common import run_guarded  # noqa: E402
from hostile_sweep_k5 import TRAIN, Case, _materialise, _script  # noqa: E402
from hostile_sweep_k5 import main as k5_main  # noqa: E402

TRACE = '{"format": "peakmem-trace", "version": 1, "meta": {}, "tags": []}\n'


@dataclass(frozen=True)
class Case6(Case):
    stdout_not: str = ""  # a text stdout must not hold (an injected line)
    json_out: bool = False  # stdout is one JSON object, an error one where the exit is not 0
    unchanged: tuple[str, ...] = ()  # input files the run must leave as they were


def _case(name: str, surface: str, argv: list[str], codes: set[int] | int, **kw) -> Case6:
    codes = {codes} if isinstance(codes, int) else codes
    return Case6(name, surface, tuple(argv), frozenset(codes), **kw)


def materialise(case: Case, root: Path) -> None:
    plain = {}
    for name, body in case.files.items():
        kind, _, rest = name.partition(" ")
        if kind in {"@fifo", "@symlink"}:  # k5 makes them, in a folder that must exist
            (root / rest).parent.mkdir(parents=True, exist_ok=True)
            plain[name] = body
        elif kind == "@pyc":  # a __pycache__ entry with a valid header and garbage code
            import importlib.util
            cache = Path(importlib.util.cache_from_source(str(root / f"{rest}.py")))
            cache.parent.mkdir(parents=True, exist_ok=True)
            plain[f"{rest}.py"] = case.files[f"{rest}.py"]
            _materialise(Case(case.name, case.surface, (), frozenset(), files=plain), root)
            plain = {}
            source = root / f"{rest}.py"
            stat = source.stat()
            header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little")
            header += int(stat.st_mtime).to_bytes(4, "little") + (stat.st_size & 0xFFFFFFFF).to_bytes(4, "little")
            cache.write_bytes(header + b"\xff\x00garbage")
        elif kind == "@gzbomb":  # 1 GiB of zeros in a 1 MB gzip
            import gzip
            with gzip.open(root / rest, "wb", compresslevel=9) as handle:
                chunk = b"\0" * (1 << 20)
                for _ in range(1024):
                    handle.write(chunk)
        else:
            plain[name] = body
    _materialise(Case(case.name, case.surface, (), frozenset(), files=plain), root)


def check(case: Case, root: Path, stdout: bytes, stderr: str) -> list[str]:
    problems = []
    for name in getattr(case, "unchanged", ()):
        written = case.files[name]
        if (root / name).read_bytes() != (written if isinstance(written, bytes) else written.encode()):
            problems.append(f"{name} was overwritten")
    text = stdout.decode(errors="replace")
    if getattr(case, "stdout_not", "") and case.stdout_not in text:
        problems.append(f"stdout holds {case.stdout_not!r}")
    if getattr(case, "json_out", False):
        try:
            json.loads(text)
        except ValueError:
            problems.append("stdout is not one JSON object")
    return problems


def torch_imports_after_startup() -> set[str]:
    """Top-level modules `import torch` loads from a path that this python had not loaded at
    its start (built-in and frozen ones, `runpy`, are found before any path entry)."""
    probe = ("import sys; before = {m.split('.')[0] for m in sys.modules}; import torch; "
             "print(' '.join(m for m in {m.split('.')[0] for m in sys.modules} - before "
             "if getattr(getattr(sys.modules[m], '__spec__', None), 'origin', None) "
             "not in ('built-in', 'frozen')))")
    return set(subprocess.check_output([sys.executable, "-c", probe], text=True).split())


def cases() -> list:
    est = ["estimate"]
    ok = _script(TRAIN)
    out = []
    # -- a file next to the script shadows a module peakmem's child imports ----------------
    shadowing = torch_imports_after_startup()
    for module in ["json", "signal", "threading", "peakmem", "typing", "click", "numpy",
                   "traceback", "tempfile", "selectors", "struct", "atexit", "runpy",
                   "importlib", "site", "sitecustomize", "usercustomize"]:
        # in job/, not the working directory: `python -m peakmem` puts that first on
        # peakmem's own sys.path (an installed `peakmem` does not). `python job/train.py`
        # imports the local file where torch's import loads a module python had not loaded at
        # its start: peakmem refuses that job (2); the others run as python runs them (0)
        body = f"raise SystemExit('shadow {module} imported')\n"
        out.append(_case(f"shadow module {module}.py next to the script", "job script",
                         [*est, "job/train.py"], {2} if module in shadowing else {0},
                         files={"job/train.py": TRAIN, f"job/{module}.py": body}))
    out.append(_case("shadow package peakmem/ next to the script", "job script",
                     [*est, "job/train.py"], {0, 1},
                     files={"job/train.py": TRAIN,
                            "job/peakmem/__init__.py": "raise SystemExit('shadow')\n"},
                     job_traceback=True))
    # -- argv and names --------------------------------------------------------------------
    out.append(_case("script argv non-utf8", "job script", [*est, "train.py", "\udcff"], {0},
                     files=ok))
    out.append(_case("script name with newline", "job script", [*est, "a\nb.py"], {0},
                     files={"a\nb.py": TRAIN}))
    out.append(_case("script name starts with dash", "job script", [*est, "--", "python", "-x.py"], {0, 2},
                     files={"-x.py": TRAIN}))
    out.append(_case("script name non-utf8", "job script", [*est, "\udcff.py"], {0},
                     files={"\udcff.py": TRAIN}))
    out.append(_case("script dir symlink loop", "job script", [*est, "train.py"], {0},
                     files={"train.py": TRAIN, "@symlink loopdir": "loopdir"}))
    out.append(_case("corrupt __pycache__ of a helper", "job script", [*est, "train.py"], {0, 1},
                     files={"train.py": "import helper\n" + TRAIN, "helper.py": "X = 1\n",
                            "@pyc helper": ""}, job_traceback=True))
    # -- gpu names -------------------------------------------------------------------------
    for gpu in ["H100-80GB", " h100-80gb", "h100-80gb,h200", ",", "ｈ100-80gb",
                "h100-80gb\u202e", "\x1b[31mh100", "h" * 100000, "a100-40gb;rm"]:
        out.append(_case(f"estimate --gpu {gpu[:20]!r}", "gpu names",
                         [*est, "--gpu", gpu, "train.py"], {0, 2}, files=ok))
    for gpu in ["", ",", "h100-80gb,,h200", "h100-80gb," * 500, "zzz,h200"]:
        out.append(_case(f"fit --gpu {gpu[:20]!r}", "gpu names",
                         ["fit", "--gpu", gpu, "--arg", "batch=1..2", "--", "python", "train.py",
                          "--batch", "{}"], {2}, files=ok))
    # -- emitted scheduler files: a value must not inject lines ----------------------------
    for fmt, option in [("slurm", "partition"), ("slurm", "account"), ("k8s-mig", "name"),
                        ("volcano", "name"), ("runai", "project"), ("ray", "name"),
                        ("hami", "name"), ("kai", "name"), ("mps", "name"), ("torch", "name")]:
        out.append(_case(f"estimate --emit {fmt} {option} with newline", "emit",
                         [*est, "--emit", fmt, "--emit-option", f"{option}=x\nINJECTED: 1",
                          "train.py"], {0, 2}, files=ok, stdout_not="\nINJECTED"))
    # -- numbers in flags ------------------------------------------------------------------
    for flag, value in [("--max-smact", "nan"), ("--max-smact", "inf"), ("--max-smact", "-1"),
                        ("--timeout", "nan"), ("--timeout", "-5")]:
        out.append(_case(f"pack {flag} {value}", "pack flags",
                         ["pack", "--gpus", "1xh100-80gb", flag, value, "e.json"], {2},
                         files={"e.json": b"{}"}))
    for value in ["nan", "-1", "inf", "1e400"]:
        out.append(_case(f"warm --idle {value}", "warm", ["warm", "--idle", value, "--status"], {1, 2},
                         timeout=60))
    out.append(_case("warm --preload empty", "warm", ["warm", "--preload", "", "--status"], {1, 2}, timeout=60))
    for value in ["nan", "-1", "inf"]:
        out.append(_case(f"bench --margin {value}", "bench",
                         ["bench", "gpumemnet-mlp1", "--data", "data", "--margin", value], {2},
                         files={"data/.keep": ""}))
    for flag, value in [("--device-index", "99999999999999999999"), ("--timeout", "inf"),
                        ("--hz", "inf"), ("--hz", "1e-300"), ("--steps", "99999999999999999999")]:
        out.append(_case(f"measure {flag} {value}", "serve / measure",
                         ["measure", flag, value, "train.py"], {2, 3}, files=ok, timeout=60))
    # -- pack ESTIMATES with odd but parseable fields --------------------------------------
    for label, body in [
        ("peak negative", {"peak_reserved_bytes": -5, "gpu": "h100-80gb"}),
        ("peak float", {"peak_reserved_bytes": 1.5, "gpu": "h100-80gb"}),
        ("peak string", {"peak_reserved_bytes": "5", "gpu": "h100-80gb"}),
        ("peak bool", {"peak_reserved_bytes": True, "gpu": "h100-80gb"}),
        ("peak 1e300", {"peak_reserved_bytes": 1e300, "gpu": "h100-80gb"}),
        ("peak 2**70", {"peak_reserved_bytes": 2**70, "gpu": "h100-80gb"}),
        ("error object", {"error": {"reason": "x", "message": "y"}}),
        ("gpu odd", {"peak_reserved_bytes": 5, "gpu": "\x1b[2J"}),
        ("null", None),
    ]:
        out.append(_case(f"pack estimate {label}", "pack ESTIMATES",
                         ["pack", "--gpus", "1xh100-80gb", "e.json"], {0, 2},
                         files={"e.json": json.dumps(body)}))
    # -- simulate trace files --------------------------------------------------------------
    for label, body in [
        ("BOM", "\ufeff" + TRACE + "[0, 1, 512, 0, -1]\n"),
        ("negative size", TRACE + "[0, 1, -512, 0, -1]\n"),
        ("huge size", TRACE + "[0, 1, 18446744073709551616, 0, -1]\n"),
        ("float size", TRACE + "[0, 1, 512.5, 0, -1]\n"),
        ("NaN size", TRACE + "[0, 1, NaN, 0, -1]\n"),
        ("bool size", TRACE + "[0, 1, true, 0, -1]\n"),
        ("free unknown", TRACE + "[1, 7, 512, 0, -1]\n"),
        ("double alloc", TRACE + "[0, 1, 512, 0, -1]\n[0, 1, 512, 0, -1]\n"),
        ("version 999", TRACE.replace('"version": 1', '"version": 999') + "[0, 1, 512, 0, -1]\n"),
        ("nested row", TRACE + "[" * 100000 + "\n"),
        ("header only", TRACE),
        ("no header", "[0, 1, 512, 0, -1]\n"),
        ("stream huge", TRACE + "[0, 1, 512, 99999999999999999999999, -1]\n"),
        ("short row", TRACE + "[0, 1]\n"),
        ("meta list", '{"format": "peakmem-trace", "version": 1, "meta": [], "tags": []}\n'),
        ("tags nested", '{"format": "peakmem-trace", "version": 1, "meta": {}, "tags": [[[[1]]]]}\n'),
        ("gzip bomb", "@gzbomb"),
        ("kind unknown", TRACE + "[99, 1, 512, 0, -1]\n"),
    ]:
        files = {"t.jsonl": body} if body != "@gzbomb" else {"@gzbomb t.jsonl.gz": ""}
        name = "t.jsonl.gz" if body == "@gzbomb" else "t.jsonl"
        out.append(_case(f"simulate trace {label}", "simulate TRACE", ["simulate", name], {0, 2},
                         files=files))
        out.append(_case(f"simulate --json trace {label}", "simulate TRACE",
                         ["simulate", "--json", name], {0, 2}, files=files, json_out=True))
    # -- replay snapshots ------------------------------------------------------------------
    import pickle
    for label, data in [
        ("os.system global", b"cos\nsystem\n(S'echo $PPID > pwned_k5'\ntR."),
        ("truncated", pickle.dumps({"segments": []})[:-3]),
        ("list", pickle.dumps([1, 2])),
        ("segments not list", pickle.dumps({"segments": 5, "device_traces": []})),
        ("traces str", pickle.dumps({"segments": [], "device_traces": "x"})),
        ("memo bomb", b"\x80\x04(" + b"]" * 10 + b"l" + b"."),
        ("huge size", pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": 0, "size": 2**80, "stream": 0}]]})),
        ("negative size", pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": 0, "size": -5, "stream": 0}]]})),
        ("float size nan", pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": 0, "size": float("nan"), "stream": 0}]]})),
        ("json not pickle", b'{"segments": []}'),
        ("empty", b""),
    ]:
        out.append(_case(f"replay snapshot {label}", "replay SNAPSHOT", ["replay", "s.pickle"], {0, 2},
                         files={"s.pickle": data}))
        out.append(_case(f"replay --json snapshot {label}", "replay SNAPSHOT",
                         ["replay", "--json", "s.pickle"], {0, 2}, files={"s.pickle": data}, json_out=True))
    # -- batch output ----------------------------------------------------------------------
    good = b'{"id": "a", "command": ["python", "train.py"]}\n'
    out.append(_case("batch -o same file as JOBS", "batch JOBS",
                     ["batch", "--in-process", "jobs.jsonl", "-o", "jobs.jsonl"], {0, 2},
                     files={"jobs.jsonl": good, "train.py": TRAIN}, timeout=120))
    out.append(_case("batch -o /dev/full", "batch JOBS",
                     ["batch", "--in-process", "jobs.jsonl", "-o", "/dev/full"], {1, 2},
                     files={"jobs.jsonl": good, "train.py": TRAIN}, timeout=120))
    out.append(_case("batch -o directory", "batch JOBS",
                     ["batch", "--in-process", "jobs.jsonl", "-o", "."], {2},
                     files={"jobs.jsonl": good, "train.py": TRAIN}, timeout=120))
    out.append(_case("batch JOBS BOM", "batch JOBS", ["batch", "--in-process", "jobs.jsonl"], {0, 2},
                     files={"jobs.jsonl": b"\xef\xbb\xbf" + good, "train.py": TRAIN}, timeout=120))
    out.append(_case("batch JOBS CRLF", "batch JOBS", ["batch", "--in-process", "jobs.jsonl"], {0},
                     files={"jobs.jsonl": good.replace(b"\n", b"\r\n"), "train.py": TRAIN}, timeout=120))
    out.append(_case("batch JOBS timeout NaN", "batch JOBS", ["batch", "--in-process", "jobs.jsonl"], {0, 1, 2},
                     files={"jobs.jsonl": b'{"id": "a", "command": ["python", "train.py"], "timeout": NaN}\n', "train.py": TRAIN}, timeout=120))
    # -- jobs that tamper with the interpreter peakmem's own code runs in after them --------
    tamper = {
        "warnings as errors": ("import warnings\nwarnings.simplefilter('error')\n" + TRAIN, {0}),
        "itimer handler raises after training": (TRAIN + "import signal\ndef h(*a): raise RuntimeError('tick')\nsignal.signal(signal.SIGALRM, h)\nsignal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)\n", {0, 1}),
        "interrupt_main from a thread after training": (TRAIN + "import _thread, threading, time\ndef loop():\n  while True:\n    _thread.interrupt_main(); time.sleep(0.001)\nthreading.Thread(target=loop, daemon=True).start()\n", {0, 1}),
        "sys.meta_path cleared": (TRAIN + "import sys\nsys.meta_path.clear()\nsys.path_hooks.clear()\nsys.path_importer_cache.clear()\n", {0}),
        "sys.modules json None": (TRAIN + "import sys\nfor m in ('json', 'traceback', 'tempfile', 'struct', 'pickle'): sys.modules[m] = None\n", {0}),
        "tempfile.tempdir missing": (TRAIN + "import tempfile\ntempfile.tempdir = '/nonexistent/k6'\n", {0}),
        "os.environ cleared": (TRAIN + "import os\nos.environ.clear()\n", {0}),
        "int max str digits": (TRAIN + "import sys\nsys.set_int_max_str_digits(640)\n", {0}),
        "RLIMIT_CPU then spin": (TRAIN + "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (1, 1))\nwhile True: pass\n", {1}),
        "child in its own process group hangs": (TRAIN + "import os, time\nif os.fork() == 0:\n  os.setpgid(0, 0)\n  time.sleep(600)\nos.wait()\n", {124}),
        "nested peakmem estimate": (TRAIN + "import subprocess, sys\nopen('inner.py', 'w').write('import torch\\ntorch.zeros(4, device=\"cuda\")\\n')\nr = subprocess.run([sys.executable, '-m', 'peakmem', 'estimate', '--json', 'inner.py'], capture_output=True, text=True)\nassert r.returncode == 0, r.stderr[-500:]\n", {0}),
        "faulthandler dumps": (TRAIN + "import faulthandler, sys, time\nfaulthandler.dump_traceback_later(0.01, repeat=True)\ntime.sleep(0.05)\n", {0}),
        "sys.flags via -W error env": (TRAIN, {0}),
        "stdout closed": (TRAIN + "import sys, os\nsys.stdout.close()\nos.close(1)\n", {0}),
        "record_memory_history": (TRAIN + "torch.cuda.memory._record_memory_history(max_entries=1000)\ntorch.zeros(8, device='cuda')\ns = torch.cuda.memory._snapshot()\ntorch.cuda.memory._dump_snapshot('snap.pickle')\n", {0, 1}),
        "pluggable allocator": (TRAIN + "torch.cuda.memory.change_current_allocator(None)\n", {0, 1, 3}),
        "cuda graph": ("import torch\nm = torch.nn.Linear(8, 8).cuda()\nx = torch.randn(2, 8, device='cuda')\ng = torch.cuda.CUDAGraph()\ns = torch.cuda.Stream()\nwith torch.cuda.stream(s):\n  m(x)\nwith torch.cuda.graph(g):\n  y = m(x)\ng.replay()\ny.sum()\n", {0, 1}),
        "event elapsed_time": (TRAIN + "a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)\na.record(); b.record(); torch.cuda.synchronize()\nprint(a.elapsed_time(b) >= 0)\n", {0}),
        "device ordinal out of range": (TRAIN + "torch.zeros(1, device='cuda:99')\n", {1}),
        "set_device out of range": (TRAIN + "torch.cuda.set_device(99)\n", {1}),
        "mem_get_info tampered": (TRAIN + "torch.cuda.mem_get_info = lambda *a: (-1, float('nan'))\ntorch.cuda.get_device_properties = None\n", {0}),
    }
    for label, (body, codes) in tamper.items():
        env = {"PYTHONWARNINGS": "error"} if label == "sys.flags via -W error env" else {}
        argv = [*est, "--timeout", "30", "train.py"] if "hangs" in label else [*est, "train.py"]
        out.append(_case(f"job {label}", "tampering job", argv, codes, files=_script(body),
                         job_traceback=True, env=env, timeout=150))
    # -- an output path that is one of the inputs ------------------------------------------
    for label, argv in [
        ("estimate --job-log the script", [*est, "--job-log", "train.py", "train.py"]),
        ("estimate --snapshot the script", [*est, "--snapshot", "train.py", "train.py"]),
        ("estimate --timeline the script as html", [*est, "--timeline", "t.html", "t.html"]),
        ("estimate --job-log via a symlink to the script", [*est, "--job-log", "log", "train.py"]),
        ("fit --job-log the script", ["fit", "--job-log", "train.py", "--arg", "batch=1..2", "--",
                                      "python", "train.py", "--batch", "{}"]),
        ("measure --out the script", ["measure", "--out", "train.py", "train.py"]),
        ("estimate --job-log equals --snapshot", [*est, "--job-log", "x.pickle", "--snapshot", "x.pickle", "train.py"]),
    ]:
        files = {"train.py": TRAIN, "t.html": TRAIN, "@symlink log": "train.py"}
        out.append(_case(label, "output is an input", argv, {2, 3}, files=files, unchanged=("train.py", "t.html"),
                         timeout=120))
    out.append(_case("estimate --model config FIFO", "--model config", [*est, "--model", "cfg"], {2},
                     files={"@fifo cfg/config.json": ""}, timeout=60))
    # -- environment variables the k5 sweep leaves out --------------------------------------
    for var, value in [("PEAKMEM_TRANSFORMERS_RELEASE", "nan"), ("PEAKMEM_TRANSFORMERS_RELEASE", "9" * 5000),
                       ("PEAKMEM_DIR", "/dev/null"), ("PEAKMEM_DATASETS", "/dev/null"),
                       ("PEAKMEM_FAKE_ESTIMATE_SECONDS", "nan"), ("PEAKMEM_SERVICE_TOKEN", "\x01"),
                       ("PYTHONWARNINGS", "error"), ("PYTHONSAFEPATH", "1"),
                       ("TMPDIR", "/nonexistent/k6"), ("TMPDIR", "/dev/null"), ("HOME", "/nonexistent"),
                       ("PATH", ""), ("COLUMNS", "-5"), ("COLUMNS", "9" * 30), ("LANG", "C"),
                       ("PYTHONIOENCODING", "ascii:strict"), ("TERM", "\x1b")]:
        out.append(_case(f"env {var}={value[:20]!r}", "environment", [*est, "train.py"], {0, 2},
                         files=ok, env={var: value}, timeout=120))
    return out


def run_one(case: Case) -> dict:
    return run_guarded(case, materialise, check)


def main() -> int:
    return k5_main(cases, run_one)  # k5's command line, table and count over these cases


if __name__ == "__main__":
    sys.exit(main())
