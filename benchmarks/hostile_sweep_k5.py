"""Run the k5 adversarial sweep: hostile inputs on every surface peakmem reads, one case a row.

    PYTHONPATH=src python benchmarks/hostile_sweep_k5.py [--only SUBSTRING] [--jobs N]

Each case runs `python -m peakmem ...` in a fresh temporary directory with a timeout and is
judged by the contract (README "Exit codes", docs/inputs.md): an exit status from the case's
allowed set, at most one `peakmem` line on stderr for a bad input, no Python traceback from
peakmem (a job's own trimmed traceback is allowed where the job raised), no timeout, exit 70
never. Prints a markdown table and the count of failures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TRAIN = """import torch
model = torch.nn.Linear(16, 16).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(4, 16, device="cuda")).sum().backward()
    opt.step(); opt.zero_grad()
"""


@dataclass(frozen=True)
class Case:
    name: str
    surface: str
    argv: tuple[str, ...]
    codes: frozenset[int]
    files: dict[str, str | bytes] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    job_traceback: bool = False  # the job's own traceback may appear
    timeout: float = 90
    program: str = ""  # a repo script run instead of `python -m peakmem` (benchmarks/...)
    prefix: str = "peakmem"  # how the program's own error line starts
    bad_input_code: int = 2  # the exit status of a refused input: one error line, no more
    job_stderr: bool = False  # the job's own stderr (libraries' import warnings) passes through


def _case(name: str, surface: str, argv: list[str], codes: set[int] | int, **kw) -> Case:
    codes = {codes} if isinstance(codes, int) else codes
    return Case(name, surface, tuple(argv), frozenset(codes), **kw)


def _script(body: str) -> dict[str, str]:
    return {"train.py": body}


ACCEPTED = {
    # judged valid: the name is stripped; the installed torch; a step count the job never
    # reaches runs it to its end; a timeout too short to start is a timeout
    ("--gpu", "h100-80gb\n"): 0, ("--torch", ""): 0, ("--steps", "9" * 40): 0,
    ("--timeout", "1e-300"): 124,
    # refused since 8d39974 as torch's std::stoi / std::stoull refuse it (the sweep still
    # expected the old acceptance: its own wrong expectation, corrected by p1)
    ("--alloc-conf", "max_split_size_mb:99999999999999999999999"): 2,
}


def cases() -> list[Case]:
    est = ["estimate"]
    out: list[Case] = []
    ok = _script(TRAIN)
    # -- estimate flags -------------------------------------------------------------------
    for flag, value in [
        ("--gpu", ""), ("--gpu", "../../etc/passwd"), ("--gpu", "h100-80gb\n"),
        ("--torch", ""), ("--torch", "nan"), ("--torch", "2." + "9" * 5000),
        ("--alloc-conf", "expandable_segments:maybe"), ("--alloc-conf", "max_split_size_mb:-1"),
        ("--alloc-conf", "garbage_collection_threshold:nan"), ("--alloc-conf", "x" * 100000),
        ("--alloc-conf", "roundup_power2_divisions:["), ("--alloc-conf", ",,,:"),
        ("--alloc-conf", "max_split_size_mb:99999999999999999999999"),
        ("--alloc-conf", "roundup_power2_divisions:[>:99999999999999999999]"),
        ("--steps", "0"), ("--steps", "-1"), ("--steps", "nan"), ("--steps", "9" * 40),
        ("--timeout", "0"), ("--timeout", "-1"), ("--timeout", "nan"), ("--timeout", "inf"),
        ("--timeout", "1e400"), ("--timeout", "1e-300"),
        ("--max-host-memory", "-1"), ("--max-host-memory", "nan"), ("--max-host-memory", "0"),
        ("--max-host-memory", "1e999GiB"), ("--max-host-memory", "9" * 400),
        ("--job-log", "/nonexistent/dir/log"), ("--job-log", "."), ("--job-log", "/dev/full"),
        ("--timeline", "/nonexistent/x.html"), ("--timeline", "out.txt"), ("--timeline", "."),
        ("--snapshot", "/nonexistent/x.pickle"), ("--snapshot", "."),
        ("--nproc-per-node", "0"), ("--ranks", ""), ("--ranks", "5-2"), ("--ranks", "a"),
        ("--ranks", "0," * 5000), ("--ranks", "99999999999999999999"),
        ("--emit-option", "noeq"), ("--emit-option", "="),
        ("--mib-per-shard", "0"), ("--batch", "0"),
    ]:
        extra = ["--emit", "k8s-mig"] if flag == "--emit-option" else []
        expect = {0, 2} if flag in {"--timeline", "--job-log"} else {2}
        if flag == "--timeout" and value in {"inf", "1e400"}:
            expect = {0, 2}
        if (flag, value) in ACCEPTED:
            expect = {ACCEPTED[flag, value]}
        out.append(_case(f"estimate {flag} {value[:24]!r}", "estimate flags",
                         [*est, flag, value, *extra, "train.py"], expect, files=ok))
    out.append(_case("estimate --emit-option k=v on slurm unknown key", "estimate flags",
                     [*est, "--emit", "slurm", "--emit-option", "zzz=1", "train.py"], 2, files=ok))
    out.append(_case("estimate --emit slurm --mib-per-shard huge", "estimate flags",
                     [*est, "--emit", "slurm", "--mib-per-shard", "9" * 30, "train.py"], {0, 2},
                     files=ok))
    # -- --model config -------------------------------------------------------------------
    for label, body in [
        ("empty", b""), ("not json", b"{"), ("list", b"[]"), ("nan dims", b'{"model_type":"gpt2","n_embd":NaN}'),
        ("negative dims", b'{"model_type":"gpt2","n_embd":-8,"n_layer":1,"n_head":1}'),
        ("huge dims", b'{"model_type":"gpt2","n_embd":99999999999999999999,"n_layer":1,"n_head":1}'),
        ("nested", b"[" * 100000 + b"]" * 100000), ("non-utf8", b'{"model_type":"\xff"}'),
        ("unknown type", b'{"model_type":"no-such-model"}'),
        ("no model_type", b'{"x":1}'),
        ("string dims", b'{"model_type":"gpt2","n_embd":"big","n_layer":1,"n_head":1}'),
    ]:
        out.append(_case(f"estimate --model config {label}", "--model config",
                         [*est, "--model", "cfg/config.json"], 2, files={"cfg/config.json": body}))
    # refused in the job (scriptgen.config_check: built_config / built_model), not the parent:
    # one bad_input line naming the field after the job's own import warnings
    gpt2 = b'"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_positions": 16, '
    for label, body in [
        ("list dims", b'{' + gpt2 + b'"vocab_size": 100, "n_embd": [64]}'),
        ("float dims", b'{' + gpt2 + b'"vocab_size": 100, "n_embd": 1e300}'),
        ("bool dims", b'{' + gpt2 + b'"vocab_size": 100, "n_embd": true}'),
        ("int64 overflow", b'{' + gpt2 + b'"vocab_size": 1099511627776, "n_embd": 1099511627776}'),
        ("heads do not divide", b'{' + gpt2 + b'"vocab_size": 100, "n_embd": 63}'),
        ("key cls", b'{' + gpt2 + b'"vocab_size": 100, "n_embd": 64, "cls": 1}'),
        ("dtype unknown", b'{' + gpt2 + b'"vocab_size": 100, "n_embd": 64, "torch_dtype": "zzz"}'),
    ]:
        out.append(_case(f"estimate --model config {label}", "--model config",
                         [*est, "--steps", "1", "--seq", "8", "--model", "cfg/config.json"], 2,
                         files={"cfg/config.json": body}, job_stderr=True, timeout=180))
    out.append(_case("estimate --model config string", "--model config",
                     [*est, "--model", "cfg/config.json"], 2, files={"cfg/config.json": b'"gpt2"'}))
    out.append(_case("estimate --model config 1 GB", "--model config",
                     [*est, "--model", "cfg/config.json"], 2, files={"@sparse cfg/config.json": "1073741824"}))
    out.append(_case("estimate --model /dev/zero", "--model config", [*est, "--model", "/dev/zero"], 2))
    out.append(_case("estimate --model empty dir", "--model config",
                     [*est, "--model", "cfg"], 2, files={"cfg/.keep": ""}))
    # -- the job script itself ------------------------------------------------------------
    for label, files, argv in [
        ("directory", {"d/.keep": ""}, ["d"]),
        ("/dev/zero", {}, ["/dev/zero"]),
        ("empty script", {"train.py": ""}, ["train.py"]),
        ("NUL bytes", {"train.py": b"import torch\x00\n"}, ["train.py"]),
        ("non-utf8", {"train.py": b"x = '\xff\xfe'\n"}, ["train.py"]),
        ("BOM", {"train.py": b"\xef\xbb\xbf" + TRAIN.encode()}, ["train.py"]),
        ("binary", {"train.py": bytes(range(256)) * 4}, ["train.py"]),
        ("-m empty", {}, ["-m", ""]),
        ("-m missing", {}, ["-m", "no_such_module_k5"]),
        ("-m dotted garbage", {}, ["-m", "..x"]),
        ("python -c", {}, ["python", "-c", "import torch; torch.zeros(1, device='cuda')"]),
        ("no args", {}, []),
        ("--", {}, ["--"]),
        ("env prefix bad", {"train.py": TRAIN}, ["env", "CUDA_VISIBLE_DEVICES=abc", "python", "train.py"]),
        ("env prefix -1", {"train.py": TRAIN}, ["env", "CUDA_VISIBLE_DEVICES=-1", "python", "train.py"]),
        ("env prefix alloc conf", {"train.py": TRAIN},
         ["env", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:maybe", "python", "train.py"]),
        ("env prefix NUL-free huge", {"train.py": TRAIN}, ["env", "X=" + "y" * 100000, "python", "train.py"]),
    ]:
        # a script python cannot compile is the job's failure (as syntax_error.py in
        # tests/data/hostile_scripts): exit 1 after python's own lines
        codes = {"BOM": {0}, "empty script": {0}, "env prefix NUL-free huge": {0},
                 "NUL bytes": {1}, "non-utf8": {1}, "binary": {1}}.get(label, {2, 3})
        out.append(_case(f"script {label}", "job script", [*est, *argv], codes, files=files,
                         job_traceback=codes == {1}))
    for label in ["loop"]:
        out.append(_case(f"script symlink {label}", "job script", [*est, "a.py"], 2,
                         files={"@symlink a.py": "b.py", "@symlink b.py": "a.py"}))
    out.append(_case("script FIFO", "job script", [*est, "fifo.py"], 2, files={"@fifo fifo.py": ""},
                     timeout=60))
    # -- hostile jobs -----------------------------------------------------------------------
    hostile = {
        "SystemExit(float)": (TRAIN + "raise SystemExit(1.5)\n", {1}),
        "SystemExit(-1)": (TRAIN + "raise SystemExit(-1)\n", {1}),
        "SystemExit(bytes)": (TRAIN + "raise SystemExit(b'\\xff')\n", {1}),
        "SystemExit(obj str raises)": (TRAIN + "class O:\n  def __str__(s): raise RuntimeError('x')\n  __repr__=__str__\nraise SystemExit(O())\n", {1}),
        "SystemExit(str ANSI newlines)": (TRAIN + "raise SystemExit('a\\n\\x1b[31mb\\r\\x00c' * 1000)\n", {1}),
        "exc name newline": (TRAIN + "E = type('E\\nFAKE peakmem: ok', (Exception,), {})\nraise E('x')\n", {1}),
        "exc str non-str": (TRAIN + "class E(Exception):\n  def __str__(s): return 5\nraise E()\n", {1}),
        "exc cause str raises": (TRAIN + "class B(Exception):\n  def __str__(s): raise ValueError\ntry:\n  raise B()\nexcept B as b:\n  raise RuntimeError('top') from b\n", {1}),
        "exc notes bad": (TRAIN + "e = ValueError('x'); e.__notes__ = 5\nraise e\n", {1}),
        "exc notes huge": (TRAIN + "e = ValueError('x'); e.__notes__ = ['n' * 100000] * 100\nraise e\n", {1}),
        "exception group": (TRAIN + "raise ExceptionGroup('g', [ValueError(i) for i in range(5000)])\n", {1}),
        "exc args huge": (TRAIN + "raise ValueError('v' * 10_000_000)\n", {1}),
        "GeneratorExit": (TRAIN + "raise GeneratorExit\n", {1}),
        "StopIteration": (TRAIN + "raise StopIteration\n", {1}),
        "MemoryError": (TRAIN + "raise MemoryError\n", {1}),
        "RecursionError in __str__": (TRAIN + "class E(Exception):\n  def __str__(s): return str(s)\nraise E()\n", {1}),
        "builtins.print None": ("import builtins\n" + TRAIN + "builtins.print = None\nbuiltins.open = None\n", {0}),
        "builtins.__import__ raises": (TRAIN + "import builtins\ndef imp(*a, **k): raise ImportError('no')\nbuiltins.__import__ = imp\n", {0, 1}),
        "builtins.__import__ raises then raise": (TRAIN + "import builtins\ndef imp(*a, **k): raise ImportError('no')\nbuiltins.__import__ = imp\nraise ValueError('v')\n", {1}),
        "sys.stdout None": (TRAIN + "import sys\nsys.stdout = None\nsys.stderr = None\nraise ValueError('v')\n", {1}),
        "sys.stderr object": (TRAIN + "import sys\nclass W:\n  def write(s, x): raise OSError('no')\n  def flush(s): raise OSError('no')\nsys.stderr = W()\nraise ValueError('v')\n", {1}),
        "sys.excepthook raises": (TRAIN + "import sys\ndef h(*a): raise RuntimeError('hook')\nsys.excepthook = h\nraise ValueError('v')\n", {1}),
        "setrecursionlimit low": (TRAIN + "import sys\nsys.setrecursionlimit(50)\nraise ValueError('v')\n", {1}),
        "settrace raises": (TRAIN + "import sys\ndef t(*a): raise RuntimeError('trace')\nsys.settrace(t)\nsys.setprofile(t)\n", {0, 1}),
        "json.dumps patched": (TRAIN + "import json\njson.dumps = None\njson.dump = None\n", {0}),
        "torch.cuda patched": ("import torch\n" + TRAIN + "torch.cuda.max_memory_allocated = None\ntorch.cuda.synchronize = None\ntorch.cuda = None\n", {0}),
        "os.kill pgrp": (TRAIN + "import os, signal\nos.killpg(os.getpgid(0), signal.SIGTERM)\n", {1}),
        "os.kill pgrp SIGKILL": (TRAIN + "import os, signal\nos.killpg(os.getpgid(0), signal.SIGKILL)\n", {1}),
        "kill -1": (TRAIN + "import os, signal\ntry:\n  os.kill(-1, 0)\nexcept Exception: pass\n", {0}),
        "dup2 devnull": (TRAIN + "import os\nfd = os.open('/dev/null', os.O_RDWR)\nfor i in range(3): os.dup2(fd, i)\nraise ValueError('v')\n", {1}),
        "umask 777": (TRAIN + "import os\nos.umask(0o777)\n", {0}),
        "chdir and rm cwd": (TRAIN + "import os, tempfile, shutil\nd = tempfile.mkdtemp(); os.chdir(d); shutil.rmtree(d)\n", {0}),
        "gc callbacks raise": (TRAIN + "import gc\ngc.callbacks.append(lambda *a: 1/0)\ngc.collect()\n", {0, 1}),
        "threading.excepthook + thread": (TRAIN + "import threading\nthreading.excepthook = None\nthreading.Thread(target=lambda: 1/0).start()\n", {1}),  # python: Thread() raises
        "sys.modules cleared": (TRAIN + "import sys\nfor k in list(sys.modules):\n  if k not in ('sys', 'builtins'): sys.modules.pop(k, None)\n", {0, 1}),
        "del sys.modules torch": (TRAIN + "import sys\ndel sys.modules['torch']\nraise ValueError('v')\n", {1}),
        "sys.exit in __del__": (TRAIN + "class D:\n  def __del__(s): raise SystemExit(7)\nd = D()\n", {0}),
        "raise in signal handler": (TRAIN + "import signal, os\ndef h(*a): raise SystemExit(9)\nsignal.signal(signal.SIGTERM, h)\nos.kill(os.getpid(), signal.SIGTERM)\n", {1}),
        "SIGSTOP self": (TRAIN + "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\n", {1, 124}),
        "SIGABRT": (TRAIN + "import os\nos.abort()\n", {1}),
        "exit before training": ("import sys\nsys.exit(0)\n", {0, 1, 3}),
        "torch.load pickle payload": ("import torch, io, pickle, os\nclass P:\n  def __reduce__(s): return (os.system, ('echo $PPID > pwned_k5',))\nb = io.BytesIO(); torch.save({'x': P()}, b); b.seek(0)\ntorch.load(b, weights_only=False)\n" + TRAIN, {0}),
        "infinite stdout": (TRAIN + "import sys\nwhile True: sys.stdout.write('x' * 65536)\n", {124}),
        "print huge line": (TRAIN + "print('y' * 50_000_000)\n", {0}),
        "stdout non-utf8 bytes": (TRAIN + "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe\\x00' * 1000)\nsys.stderr.buffer.write(b'\\xff\\x00\\x1b[2J')\n", {0}),
    }
    for label, (body, codes) in hostile.items():
        argv = [*est, "train.py"]
        if label in {"infinite stdout", "SIGSTOP self"}:
            argv = [*est, "--timeout", "15", "train.py"]
        out.append(_case(f"job {label}", "hostile job", argv, codes, files=_script(body),
                         job_traceback=True))
    # -- environment ------------------------------------------------------------------------
    for var, value in [
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:maybe"),
        ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:nan"),
        ("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync"),
        ("PYTORCH_CUDA_ALLOC_CONF", "\udcff"),
        ("CUDA_VISIBLE_DEVICES", "abc"), ("CUDA_VISIBLE_DEVICES", ""), ("CUDA_VISIBLE_DEVICES", "-1"),
        ("CUDA_VISIBLE_DEVICES", "0,0"), ("CUDA_VISIBLE_DEVICES", "9" * 30),
        ("CUDA_VISIBLE_DEVICES", "GPU-" + "f" * 5000),
        ("PEAKMEM_MAX_HOST_MEMORY", "nan"), ("PEAKMEM_MAX_HOST_MEMORY", "-5"),
        ("PEAKMEM_MAX_INPUT_BYTES", "0"), ("PEAKMEM_MAX_INPUT_BYTES", "x"),
        ("PEAKMEM_EAGER_RAM_BYTES", "inf"), ("PEAKMEM_REPEAT_STEADY", "maybe"),
        ("PEAKMEM_KEEP_JOB_FILES", "\udcff"), ("PEAKMEM_JOB_FILES_BACKUP_LIMIT", "nan"),
        ("PEAKMEM_JOB_FILES_BACKUP_LIMIT", "-1"), ("PEAKMEM_ATEXIT_SECONDS", "nan"),
        ("PEAKMEM_ATEXIT_SECONDS", "-1"), ("PEAKMEM_ATEXIT_SECONDS", "1e400"),
        ("PEAKMEM_RUNTIME_DIR", "/nonexistent/x"), ("PEAKMEM_RUNTIME_DIR", "/dev/null"),
        ("PEAKMEM_WARM", "maybe"), ("PEAKMEM_SANDBOX", "maybe"), ("PEAKMEM_SYS_PATH_APPEND_CWD", "x"),
        ("TORCH_LINEAR_FLATTEN_3D", "x"), ("CUBLAS_WORKSPACE_CONFIG", ":4096:x"),
        ("CUBLAS_WORKSPACE_CONFIG", ":999999999999999999999:8"), ("CUDA_MODULE_LOADING", "\x1b"),
        ("XDG_CACHE_HOME", "/dev/null"), ("HF_HOME", "/dev/null"), ("LOCAL_RANK", "x"),
        ("DISABLE_ADDMM_CUDA_LT", "x"),
    ]:
        out.append(_case(f"env {var}={value[:20]!r}", "environment", [*est, "train.py"], {0, 2},
                         files=ok, env={var: value}))
    # -- files read back --------------------------------------------------------------------
    bad_json = {
        "empty": b"", "not json": b"{", "nested": b"[" * 200000, "NaN": b'{"peak_bytes": NaN}',
        "non-utf8": b'{"a": "\xff"}', "BOM": b"\xef\xbb\xbf{}", "list": b"[1]",
        "huge number": b'{"peak_bytes": 1' + b"0" * 5000 + b"}",
        "duplicate keys": b'{"peak_bytes": 1, "peak_bytes": -1}',
        "lone surrogate": b'{"a": "\\udcff"}',
        "NUL": b'{"a": 1}\x00',
    }
    for label, body in bad_json.items():
        out.append(_case(f"pack estimate {label}", "pack ESTIMATES", ["pack", "e.json"], 2,
                         files={"e.json": body}))
    jsonl = {
        "empty": b"", "blank lines": b"\n\n\n", "not object": b"[1,2]\n", "not json": b"{\n",
        "nested": b'{"id": "a", "command": ' + b"[" * 100000 + b"\n",
        "non-utf8": b'{"id": "\xff", "command": ["python", "train.py"]}\n',
        "NUL": b'{"id": "a\x00", "command": ["python", "train.py"]}\n',
        "lone surrogate": b'{"id": "\\udcff", "command": ["python", "train.py"]}\n',
        "dup ids": b'{"id": "a", "command": ["python", "train.py"]}\n{"id": "a", "command": ["python", "train.py"]}\n',
        "dup keys": b'{"id": "a", "id": 5, "command": ["python", "train.py"]}\n',
        "id int": b'{"id": 5, "command": ["python", "train.py"]}\n',
        "id path": b'{"id": "../../x", "command": ["python", "train.py"]}\n',
        "id huge": b'{"id": "' + b"i" * 100000 + b'", "command": ["python", "train.py"]}\n',
        "command str": b'{"id": "a", "command": "python train.py"}\n',
        "command empty": b'{"id": "a", "command": []}\n',
        "command nested": b'{"id": "a", "command": [["python"]]}\n',
        "unknown key": b'{"id": "a", "command": ["python", "train.py"], "zzz": 1}\n',
        "files bad": b'{"id": "a", "command": ["python", "train.py"], "files": {"../x": "y"}}\n',
        "files abs": b'{"id": "a", "command": ["python", "train.py"], "files": {"/tmp/k5_abs": "y"}}\n',
        "files NaN": b'{"id": "a", "command": ["python", "train.py"], "files": NaN}\n',
        "huge line": b'{"id": "a", "command": ["python", "' + b"x" * 30_000_000 + b'"]}\n',
        "gpu unknown": b'{"id": "a", "command": ["python", "train.py"], "gpu": "zzz"}\n',
        "gpu int": b'{"id": "a", "command": ["python", "train.py"], "gpu": 5}\n',
    }
    for label, body in jsonl.items():
        out.append(_case(f"batch jobs {label}", "batch JOBS", ["batch", "--in-process", "jobs.jsonl"], {0, 1, 2},
                         files={"jobs.jsonl": body, "train.py": TRAIN}))
        out.append(_case(f"pack --jobs {label}", "pack --jobs",
                         ["pack", "--gpus", "1xh100-80gb", "--jobs", "jobs.jsonl"], {0, 2},
                         files={"jobs.jsonl": body, "train.py": TRAIN}))
    for label, path in [("dir", "."), ("/dev/zero", "/dev/zero"), ("missing", "nope.jsonl")]:
        out.append(_case(f"batch jobs {label}", "batch JOBS", ["batch", "--in-process", path], 2))
        out.append(_case(f"pack --jobs {label}", "pack --jobs", ["pack", "--jobs", path, "--gpus", "1xh100-80gb"], 2))
    for inv in ["", "0xh100-80gb", "-1xh100-80gb", "99999999999999999999xh100-80gb", "1xzzz",
                "1x" + "a" * 100000, "nanxh100-80gb", ",,,", "1xh100-80gb:" + "9" * 50]:
        out.append(_case(f"pack --gpus {inv[:24]!r}", "pack flags",
                         ["pack", "--gpus", inv, "e.json"], 2, files={"e.json": b"{}"}))
    # -- fit --------------------------------------------------------------------------------
    for arg in ["", "batch", "batch=", "batch=1..", "batch=5..1", "batch=-5..-1", "batch=0..9" + "9" * 40,
                "batch=1.5..3", "=1..3", "batch=nan..inf"]:
        out.append(_case(f"fit --arg {arg[:24]!r}", "fit flags", ["fit", "--arg", arg, "--", "python", "train.py", "--batch", "{}"], 2,
                         files=ok))
    out.append(_case("fit --gpu ,,,", "fit flags", ["fit", "--gpu", ",,,", "--arg", "batch=1..4", "--", "python", "train.py"], 2, files=ok))
    # -- simulate/replay odd flags ---------------------------------------------------------
    for flag, value in [("--capacity", "1e999"), ("--capacity", "0"), ("--capacity", "-0"),
                        ("--capacity", "18446744073709551616"), ("--capacity", "1.5GiB"),
                        ("--capacity", "NaNGiB"), ("--torch", "2.4\x1b")]:
        out.append(_case(f"simulate {flag} {value!r}", "simulate flags",
                         ["simulate", flag, value, "t.jsonl"], {0, 2},
                         files={"t.jsonl": '{"format": "peakmem-trace", "version": 1, "meta": {}, "tags": []}\n[0, 1, 512, 0, -1]\n'}))
    # -- bench ------------------------------------------------------------------------------
    for label, argv in [("data /dev/zero", ["bench", "gpumemnet-mlp1", "--data", "/dev/zero"]),
                        ("data missing", ["bench", "gpumemnet-mlp1", "--data", "nope"]),
                        ("cache dir", ["bench", "gpumemnet-mlp1", "--data", "data", "--cache", "."]),
                        ("cache fifo", ["bench", "gpumemnet-mlp1", "--data", "data", "--cache", "fifo"]),
                        ("unknown dataset", ["bench", "zzz"]),
                        ("estimators empty", ["bench", "gpumemnet-mlp1", "--estimators", ",,"]),
                        ("report /dev/null", ["bench", "gpumemnet-mlp1", "--data", "data", "--report", "/dev/null"])]:
        out.append(_case(f"bench {label}", "bench", argv, 2, files={"@fifo fifo": "", "data/.keep": ""}))
    # -- serve / warm / measure: refused before any server or job starts --------------------
    for label, argv, files in [
        ("serve token /dev/zero", ["serve", "--token-file", "/dev/zero"], {}),
        ("serve token empty", ["serve", "--token-file", "tok"], {"tok": ""}),
        ("serve token non-utf8", ["serve", "--token-file", "tok"], {"tok": b"\xff\xfe"}),
        ("serve token fifo", ["serve", "--token-file", "fifo"], {"@fifo fifo": ""}),
        ("serve tls missing", ["serve", "--tls-cert", "nope.pem", "--tls-key", "nope.key"], {}),
        ("serve tls garbage", ["serve", "--tls-cert", "c.pem", "--tls-key", "k.pem"],
         {"c.pem": "x", "k.pem": "y"}),
        ("serve store is file", ["serve", "--store", "f", "--processes", "2"], {"f": "x"}),
        ("serve processes without store", ["serve", "--processes", "2"], {}),
        ("serve estimator missing", ["serve", "--estimator", "no_such_module_k5:run"], {}),
        ("serve emit unknown", ["serve", "--emit", "zzz"], {}),
        ("serve max-host-memory nan", ["serve", "--max-host-memory", "nan"], {}),
        ("measure steps 0", ["measure", "--steps", "0", "train.py"], {"train.py": TRAIN}),
        ("measure hz nan", ["measure", "--hz", "nan", "train.py"], {"train.py": TRAIN}),
        ("measure out dir", ["measure", "--out", ".", "train.py"], {"train.py": TRAIN}),
    ]:
        out.append(_case(label, "serve / measure", argv, {2, 3}, files=files, timeout=60))
    for label, value in [("file", "f"), ("dev null", "/dev/null"), ("symlink loop", "loop")]:
        out.append(_case(f"warm --status runtime dir {label}", "warm", ["warm", "--status"], {1, 2},
                         files={"f": "x", "@symlink loop": "loop"},
                         env={"PEAKMEM_RUNTIME_DIR": value}, timeout=60))
    out += merge_cases() + shapes_cases()
    return out


def merge_cases() -> list[Case]:
    """benchmarks/merge_parallel_sweep.py on files a user gives it: click's `Error: ...`, exit 1."""
    import gzip

    from peakmem.measure.groundtruth import ALL_COLUMNS

    header = ",".join(ALL_COLUMNS) + "\n"
    row = {c: "" for c in ALL_COLUMNS} | {"job": "benchmarks/zoo/mlp.py", "args": "--batch-size 2",
                                          "status": "ok", "peak_source": "nvml-process",
                                          "measured_at": "2026-11-27T21:39:30Z", "seconds": "3"}
    gt = header + ",".join(row[c] for c in ALL_COLUMNS) + "\n"
    log = "2026/11/27 21:39:00.000, 50000, 143771\n2026/11/27 21:40:00.000, 50000, 143771\n"
    future = log.replace("2026/", "2036/")
    cases = {
        "committed not ground truth": ({"c.csv": "a,b\n1,2\n"}, {}),
        "committed empty": ({"c.csv": ""}, {}),
        "committed binary": ({"c.csv": bytes(range(128, 256)) * 30}, {}),
        "new csv empty": ({}, {"n.csv": ""}),
        "new csv binary": ({}, {"n.csv": bytes(range(128, 256)) * 30}),
        "new csv huge field": ({}, {"n.csv": gt.replace("mlp.py", "m" * 200_000)}),
        "log gzip bomb": ({}, {"log.gz": gzip.compress(b"\0" * (100 << 20))}),
        "log gzip truncated": ({}, {"log.gz": gzip.compress(log.encode() * 50)[:30]}),
        "log binary": ({}, {"log.gz": bytes(range(256)) * 40}),
        "log empty": ({}, {"log.gz": ""}),
        "log timestamps in the future": ({}, {"log.gz": future}),
        "out in a missing dir": ({}, {}),
    }
    out = []
    for label, (committed, other) in cases.items():
        files = {"c.csv": header, "n.csv": gt, "log.gz": log} | committed | other
        target = "missing/o.csv" if label == "out in a missing dir" else "o.csv"
        out.append(_case(f"merge_parallel_sweep {label}", "merge_parallel_sweep",
                         ["--committed", "c.csv", "--device-log", "log.gz", "--out", target,
                          "n.csv"], 1, files=files, program="benchmarks/merge_parallel_sweep.py",
                         prefix="Error: ", bad_input_code=1, timeout=60))
    return out


def shapes_cases() -> list[Case]:
    """benchmarks/cudnn_probe.py --shapes FILE --dry-run on a malformed file: one
    `cudnn_probe: error: FILE:LINE` line, exit 2, before any case."""
    header = "n,cin,h,w,cout,kernel,stride,padding,dilation,groups,dtype_mode,layout\n"
    good = "2,4,8,8,4,3,1,1,1,1,tf32,nchw\n"
    bodies = {
        "empty": "", "header only": header, "binary": bytes(range(128, 256)) * 30,
        "not integer": header + good.replace("2,4", "2,x"), "bias x": header[:-1] + ",bias\n" + good[:-1] + ",x\n",
        "stride 0": header + "2,4,8,8,4,3,0,1,1,1,tf32,nchw\n",
        "groups 0": header + "2,4,8,8,4,3,1,1,1,0,tf32,nchw\n",
        "int32 overflow": header + "99999999999,4,8,8,4,3,1,1,1,1,tf32,nchw\n",
        "unknown mode": header + good.replace("tf32", "fp8"), "NUL": header + good.replace("nchw", "nchw\x00"),
        "huge field": header[:-1] + ",job\n" + good[:-1] + "," + "j" * 200_000 + "\n",
    }
    return [_case(f"cudnn_probe --shapes {label}", "cudnn_probe --shapes",
                  ["--shapes", "s.csv", "--dry-run", "out"], 2, files={"s.csv": body},
                  program="benchmarks/cudnn_probe.py", prefix="cudnn_probe: error:", timeout=60)
            for label, body in bodies.items()]


def _materialise(case: Case, root: Path) -> None:
    for name, body in case.files.items():
        if name.startswith("@symlink "):
            (root / name.split(" ", 1)[1]).symlink_to(str(body))
            continue
        if name.startswith("@fifo "):
            os.mkfifo(root / name.split(" ", 1)[1])
            continue
        if name.startswith("@sparse "):  # a file of that size with no blocks written
            path = root / name.split(" ", 1)[1]
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("wb") as handle:
                handle.truncate(int(body))
            continue
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body if isinstance(body, bytes) else body.encode())


def _env_bytes(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape")


def run_case(case: Case, materialise=None, check=None) -> dict:
    """Run one case and judge it; `materialise(case, root)` writes its files (default
    `_materialise`), `check(case, root, stdout, stderr)` returns more problems (the k6 sweep's)."""
    with tempfile.TemporaryDirectory(prefix="k5sweep-") as tmp:
        root = Path(tmp)
        (materialise or _materialise)(case, root)
        env = {k.encode(): v.encode() for k, v in os.environ.items()}
        for k, v in case.env.items():
            env[k.encode()] = _env_bytes(v)
        start = time.monotonic()
        program = [str(REPO / case.program)] if case.program else ["-m", "peakmem"]
        with subprocess.Popen([sys.executable, *program, *case.argv], cwd=root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, start_new_session=True) as proc:
            try:
                stdout, err = proc.communicate(timeout=case.timeout)
                code = proc.returncode
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                stdout, err = proc.communicate()
                code = None
        stderr = err.decode(errors="replace")
        seconds = time.monotonic() - start
        marker = root / "pwned_k5"  # a payload writes the pid of the process it ran in
        pwned = marker.exists() and marker.read_text().strip() == str(proc.pid)
        extra = check(case, root, stdout, stderr) if check else []
    lines = [line for line in stderr.splitlines() if line.strip()]
    peak_lines = [line for line in lines if line.startswith(case.prefix)]
    counted = peak_lines if case.job_stderr else lines
    traceback = "Traceback (most recent call last)" in stderr
    problems = []
    if code is None:
        problems.append("timeout")
    elif code not in case.codes:
        problems.append(f"exit {code} not in {sorted(case.codes)}")
    if code == 70:
        problems.append("internal")
    if traceback and not case.job_traceback:
        problems.append("traceback")
    if traceback and case.job_traceback and "peakmem/" in stderr.split("Traceback")[-1] and code == 70:
        problems.append("peakmem traceback")
    if code not in (0, None) and not peak_lines and code != 124:
        problems.append("no peakmem line")
    if code == case.bad_input_code and len(counted) > 1 and not case.job_traceback:
        problems.append(f"{len(counted)} stderr lines")
    if pwned:
        problems.append("payload ran in peakmem's own process")
    problems += extra
    return {"name": case.name, "surface": case.surface, "exit": code, "lines": len(lines),
            "traceback": traceback, "seconds": round(seconds, 1), "problems": problems,
            "last": (peak_lines[-1] if peak_lines else (lines[-1] if lines else ""))[:160],
            "stdout_bytes": len(stdout)}


def main(all_cases: Callable[[], list[Case]] | None = None,
         run: Callable[[Case], dict] | None = None) -> int:
    """The sweep's command line over `all_cases()` (this sweep's own by default), each case run
    by `run` (`run_case`); hostile_sweep_k6.py passes its own."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    selected = [c for c in (all_cases or cases)()
                if args.only in c.name or args.only in c.surface]
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run or run_case, selected))
    if args.json:
        print(json.dumps(rows, indent=1))
    print("| surface | case | exit | stderr lines | traceback | s | verdict |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        verdict = "ok" if not r["problems"] else "FAIL: " + "; ".join(r["problems"]) + " -- " + r["last"]
        name = r["name"].replace("|", "\\|").replace("\n", "\\n")
        print(f"| {r['surface']} | {name} | {r['exit']} | {r['lines']} | {r['traceback']} | {r['seconds']} | {verdict} |")
    failures = sum(1 for r in rows if r["problems"])
    print(f"\n{len(rows)} cases, {failures} failures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
