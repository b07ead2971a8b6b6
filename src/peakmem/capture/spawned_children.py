"""Child interpreters the job starts through multiprocessing's `spawn` and `forkserver` start
methods (`mp.set_start_method("spawn")` + `mp.Process`, `get_context("spawn").Pool`,
`ProcessPoolExecutor(mp_context=...)`, torch.multiprocessing's, evaluation workers): each runs
under the fake GPU too, as a process of its own with its own CUDA context and allocator.

Such a child is a fresh `python -c "from multiprocessing.spawn import spawn_main; ..."` (or a
fork of the `forkserver` process, itself such a python). It re-imports the job's script as
`__mp_main__` (its top level runs again: `model.cuda()` there runs in the child too), unpickles
the process object and runs its target. Without peakmem it ran on this machine's CPU-only torch
and failed at the first CUDA call ("Torch not compiled with CUDA enabled"), failing the job.

During a capture (in the job's process, peakmem.capture.child) `multiprocessing.util.
spawnv_passfds`, which starts both the spawn children and the forkserver, puts a bootstrap
(`boot`) before the child's own `-c` program: it replaces `multiprocessing.spawn._main` (preparing
`__mp_main__`, unpickling and running the process object) with one that runs it under a capture
of its own (`runner._run_captured`, every step: the step limit stops the job's own loop, not its
workers'). When the child's target returns, the child replays its trace through the allocator
simulation (`estimate_capture`, the job's GPU, torch version and allocator configuration) and
writes one small JSON report in the job's private directory (`REPORT_PREFIX` + pid); a child
ended by SIGTERM (`Pool.terminate`, `with Pool(...)`'s exit) reports what it ran until then.
The job's process reads the reports (`attach`: JSON, each field checked) into
`CaptureResult.processes`; `estimate_capture` adds the device memory of those that used the
device (its context, libraries and peak reserved) to `peak_bytes` as a process of its own on
the same GPU, with a note (`processes_note`). Children that used no device memory (DataLoader
workers, host-only helpers) are counted at 0 and noted.

The children are descendants of the job's process in its process group: the supervisor's
timeout, host-memory cap and end-of-job cleanup cover them as they cover the job.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

REPORT_PREFIX = "spawned-"
"""The reports' file names: REPORT_PREFIX + pid + ".json", in the directory `configure` gave."""

MAX_REPORTS = 256
"""Reports read at most (more children are counted, not listed)."""

_CONFIG: dict[str, Any] = {}
"""Set by `configure` in the job's process (and by `boot` in each child): "dir" (where reports
go), "gpu", "torch_version", "mode"; empty: children are started unchanged."""

_LAUNCHED = {"spawn": 0, "forkserver": 0, "subprocess": 0}
"""Children started with the bootstrap in this process (forkserver: the server itself;
subprocess: Python processes the job starts itself, capture.python_subprocesses)."""

METHODS = ("spawn", "forkserver", "subprocess", "exec")
"""How a reporting process was started: multiprocessing's two methods, a Python command the
job ran (`subprocess`, `os.system`), or the part of a process before it replaced itself with
`os.execv` (`exec`: its device memory ended there)."""

_PROGRAMS = {
    "spawn": "from multiprocessing.spawn import spawn_main",
    "forkserver": "from multiprocessing.forkserver import main",
}
"""How each start method's child program begins (`spawn.get_command_line`,
`ForkServer.ensure_running`); other programs (the resource tracker) are left alone."""

_BOOT = (
    "import sys; sys.path.insert(0, {src!r}); "
    "from peakmem.capture.spawned_children import boot; boot({config!r})\n"
)


def configure(directory: str | Path, gpu: str, torch_version: str, mode: str,
              request: str | Path | None = None, role: str = "job") -> None:
    """Boot the job's spawn / forkserver children under the fake GPU (`gpu` a profile name),
    reporting in `directory`. `request`: the job's request file, which its Python subprocesses
    are captured from (capture.python_subprocesses); `role`: "job" (the job's own process) or
    "subprocess" (one of those)."""
    _CONFIG.clear()
    _CONFIG.update(dir=str(directory), gpu=gpu, torch_version=torch_version, mode=mode,
                   pid=os.getpid(), role=role)
    _CONFIG["start"] = time.monotonic()  # (the part before an exec reports from here)
    if request is not None:
        _CONFIG["request"] = os.path.abspath(request)
    for key in _LAUNCHED:
        _LAUNCHED[key] = 0


def start_method(program: str) -> str | None:
    """"spawn" / "forkserver" for a child's `-c` program of that start method, else None."""
    for method, start in _PROGRAMS.items():
        if program.startswith(start):
            return method
    return None


def booted_args(args: list[Any]) -> list[Any]:
    """`args` of a python command line with the bootstrap put before its `-c` program where that
    program starts a spawn child or the forkserver (unchanged otherwise, or when not configured)."""
    if not _CONFIG or "-c" not in args[:-1]:
        return args
    at = args.index("-c") + 1
    program = args[at]
    method = start_method(program) if isinstance(program, str) else None
    if method is None:
        return args
    import peakmem

    src = str(Path(peakmem.__file__).resolve().parents[1])
    _LAUNCHED[method] += 1
    config = {key: _CONFIG[key] for key in ("dir", "gpu", "torch_version", "mode")}
    boot_line = _BOOT.format(src=src, config=json.dumps({**config, "method": method}))
    return [*args[:at], boot_line + program, *args[at + 1:]]


def patches(session: Any) -> dict[tuple[Any, str], Any]:
    import multiprocessing.util as util

    real = util.spawnv_passfds

    def spawnv_passfds(path: Any, args: Any, passfds: Any) -> Any:
        if isinstance(args, list):
            args = booted_args(args)
        return real(path, args, passfds)

    return {(util, "spawnv_passfds"): spawnv_passfds}


# -- in the child -------------------------------------------------------------------------------


def boot(config_text: str) -> None:
    """The child's bootstrap (before its own program): its process objects run under a capture."""
    del sys.path[0]  # peakmem's entry (prepare() sets the job's sys.path afterwards)
    config = json.loads(config_text)
    config["start"] = time.monotonic()  # (the forkserver's forks: set again in run_child)
    _CONFIG.clear()
    _CONFIG.update(config)
    for key in _LAUNCHED:
        _LAUNCHED[key] = 0
    import multiprocessing.spawn as spawn

    # torch, the capture and the replay, once (forkserver: before its forks)
    from peakmem.capture import runner  # noqa: F401
    from peakmem.estimate import api  # noqa: F401

    real_main = spawn._main

    def captured_main(fd: int, parent_sentinel: Any) -> int:
        return run_child(real_main, fd, parent_sentinel, config)

    spawn._main = captured_main


def run_child(real_main: Any, fd: int, parent_sentinel: Any, config: dict[str, Any]) -> int:
    """`real_main(fd, parent_sentinel)` (multiprocessing.spawn._main) under a capture; its exit
    code. Writes the child's report.

    SIGTERM (`Pool.terminate`, the exit of `with Pool(...)`: the workers may be running their
    loop or already writing their report) ends the process as it would (status -SIGTERM), after
    the report: while the target runs it is raised there as SystemExit (the capture ends, its
    trace so far is reported); before, the target does not run; after, it waits for the
    report."""
    import signal

    from peakmem.capture.runner import _run_captured
    from peakmem.jobs.stop import parse_steps
    from peakmem.profiles import load_gpu, load_stack

    gpu, stack = load_gpu(config["gpu"]), load_stack(config["torch_version"])
    if config.get("method") == "forkserver":  # a fork of the server: it starts now
        config = {**config, "start": time.monotonic()}
    state: dict[str, Any] = {"code": 1, "running": False, "terminated": False}

    def job() -> None:
        if state["terminated"]:  # while the capture was being set up: nothing of it runs
            raise SystemExit(-signal.SIGTERM)
        state["running"] = True
        try:
            state["code"] = real_main(fd, parent_sentinel)
        except SystemExit as exc:  # the script's top level exited while imported as __mp_main__
            state["code"] = _exit_status(exc.code)
            raise
        finally:
            state["running"] = False

    def on_sigterm(signum: int, frame: Any) -> None:
        state["terminated"] = True
        if state["running"]:
            state["running"] = False
            raise SystemExit(-signal.SIGTERM)

    previous = None
    with contextlib.suppress(ValueError):  # (not the main thread: no handler)
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    result = _run_captured(job, gpu, stack, parse_steps("all"), None, config.get("mode", "fake"))
    if state["terminated"]:
        state["code"] = -signal.SIGTERM
    elif result.error is not None and result.reason != "exit":
        with contextlib.suppress(BaseException):  # what python prints for the child's error
            sys.stderr.write((result.error_text or "").rstrip() + "\n")
        state["code"] = 1
    with contextlib.suppress(BaseException):
        _write_report(result, config, gpu, stack, state["code"])
    if state["terminated"]:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
    with contextlib.suppress(ValueError, TypeError):
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    return state["code"]


def _exit_status(code: Any) -> int:
    if code is None or code is False:
        return 0
    return code if type(code) is int else 1


def _write_report(result: Any, config: dict[str, Any], gpu: Any, stack: Any, code: Any,
                  name: str | None = None) -> None:
    """The child's report: its own process's device memory (context + libraries + peak
    reserved; not its own children's, which report themselves), when it was alive, how it
    ended."""
    import multiprocessing

    used = used_device(result)
    if name is None:
        name = str(multiprocessing.current_process().name)
    report: dict[str, Any] = {
        "pid": os.getpid(),
        "parent": os.getppid(),
        "name": name[:200],
        "method": config.get("method", "spawn"),
        "start": float(config.get("start", time.monotonic())),
        "end": 0.0,
        "steps": max(0, int(getattr(result, "steps", 0) or 0)),
        "fake_limit": (str(result.fake_limit)[:500]
                       if getattr(result, "fake_limit", None) is not None else None),
        "exit_code": code if type(code) is int else 1,
        "device": used,
        "peak_bytes": 0,
        "context_bytes": 0,
        "library_bytes": 0,
        "peak_reserved_bytes": 0,
        "peak_allocated_bytes": 0,
        "error": None,
    }
    if used:
        from peakmem.capture.job_alloc_conf import environ_conf
        from peakmem.estimate.api import estimate_capture

        try:
            estimate = estimate_capture(
                result, gpu, stack, torch_version=config["torch_version"],
                alloc_conf=environ_conf(os.environ, config["torch_version"]) or "",
                mode=config.get("mode", "fake"),
            )
        except Exception as exc:  # noqa: BLE001 - the allocator settings refused: say so
            report["error"] = f"{type(exc).__name__}: {exc}"[:500]
            report["peak_allocated_bytes"] = int(result.peak_device_bytes)
        else:
            own = estimate.context_bytes + estimate.library_bytes + estimate.peak_reserved_bytes
            report.update(
                peak_bytes=int(own), context_bytes=int(estimate.context_bytes),
                library_bytes=int(estimate.library_bytes),
                peak_reserved_bytes=int(estimate.peak_reserved_bytes),
                peak_allocated_bytes=int(estimate.peak_allocated_bytes),
            )
    report["end"] = time.monotonic()  # the process ends now: its device memory with it
    suffix = f"-{config['part']}" if config.get("part") else ""  # the part before an exec
    path = Path(config["dir"]) / f"{REPORT_PREFIX}{os.getpid()}{suffix}.json"
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(report), encoding="utf-8")
    os.replace(temporary, path)


# -- back in the job's process ------------------------------------------------------------------

def _moment(value: Any) -> bool:
    return type(value) is float and math.isfinite(value) and value >= 0


_REPORT_FIELDS: dict[str, Any] = {
    "pid": lambda v: type(v) is int and v > 0,
    "parent": lambda v: type(v) is int and v >= 0,
    "name": lambda v: isinstance(v, str) and len(v) <= 200,
    "method": lambda v: v in METHODS,
    "start": _moment,
    "end": _moment,
    "steps": lambda v: type(v) is int and 0 <= v < (1 << 62),
    "fake_limit": lambda v: v is None or (isinstance(v, str) and len(v) <= 500),
    "exit_code": lambda v: type(v) is int and -(1 << 31) <= v < (1 << 31),
    "device": lambda v: isinstance(v, bool),
    "peak_bytes": lambda v: type(v) is int and 0 <= v < (1 << 62),
    "context_bytes": lambda v: type(v) is int and 0 <= v < (1 << 62),
    "library_bytes": lambda v: type(v) is int and 0 <= v < (1 << 62),
    "peak_reserved_bytes": lambda v: type(v) is int and 0 <= v < (1 << 62),
    "peak_allocated_bytes": lambda v: type(v) is int and 0 <= v < (1 << 62),
    "error": lambda v: v is None or (isinstance(v, str) and len(v) <= 500),
}
"""A report's fields and their checks (the children run the job's code: nothing is trusted)."""


def valid_report(report: Any) -> bool:
    return (isinstance(report, dict) and set(report) == set(_REPORT_FIELDS)
            and all(check(report[name]) for name, check in _REPORT_FIELDS.items())
            and report["start"] <= report["end"])


def read_reports(directory: str | Path) -> list[dict[str, Any]]:
    """The well-formed reports in `directory`, by pid (regular files only, at most 64 KiB each)."""
    found = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    for name in names:
        if not (name.startswith(REPORT_PREFIX) and name.endswith(".json")):
            continue
        try:
            fd = os.open(Path(directory) / name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                         | getattr(os, "O_NONBLOCK", 0))  # a FIFO named as a report: no wait
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                continue
            with os.fdopen(fd, "rb") as handle:
                data = handle.read(1 << 16)
            report = json.loads(data.decode("utf-8"))
        except (OSError, ValueError, RecursionError):
            continue
        if valid_report(report):
            found.append(report)
        if len(found) >= MAX_REPORTS:
            break
    return sorted(found, key=lambda report: (report["start"], report["pid"]))


SHUTDOWN_SECONDS = 120.0
"""How long the end of the job waits for its children at most (python's own shutdown waits for
ever; the job's time limit still applies)."""


def end_children(limit: float = SHUTDOWN_SECONDS) -> None:
    """What python's shutdown does with the job's multiprocessing children
    (`multiprocessing.util._exit_function`, an atexit handler, which the job's process does not
    reach: it ends with os._exit after its result): daemonic ones are terminated (SIGTERM: they
    report first), then all are joined, here within `limit` seconds in all."""
    import multiprocessing
    import time

    deadline = time.monotonic() + limit
    with contextlib.suppress(Exception):
        children = multiprocessing.active_children()
        for child in children:
            if child.daemon:
                child.terminate()
        for child in children:
            child.join(max(0.0, deadline - time.monotonic()))


def attach(result: Any, shutdown: bool = True) -> None:
    """The children's reports into `result.processes` (the job's process, once the job ended:
    `shutdown` first ends its children as python's shutdown would; not after the job's
    os._exit, which skips it), with a note for spawn children that did not report."""
    if not _CONFIG:
        return
    if shutdown and (_LAUNCHED["spawn"] or _LAUNCHED["forkserver"]):
        end_children()
    # every report in the directory: grandchildren (a subprocess's own workers) and the part
    # of this process before an exec report there too
    reports = read_reports(_CONFIG["dir"])
    result.processes = reports
    own = os.getpid()
    missing = _LAUNCHED["spawn"] - sum(
        1 for report in reports if report["method"] == "spawn" and report["parent"] == own)
    if getattr(result, "error", None) is not None and getattr(result, "fake_limit", 1) is None:
        # a Python process the job started failed where fake mode cannot go (and the job with
        # it): auto mode reruns the job, its processes included, in eager mode
        for report in reports:
            if report["fake_limit"] and report["exit_code"] != 0 and report["parent"] == own:
                result.fake_limit = f"in `{report['name'][:120]}`: {report['fake_limit']}"
                break
    if missing > 0:
        result.notes.append(
            f"{missing} spawn child process(es) of the job did not report (still running when "
            "the job ended, or killed): their device memory is not in this estimate")


def used_device(capture: Any) -> bool:
    """Whether a capture's own process allocated device memory (or loaded a library on it)."""
    from peakmem.trace.events import ALLOC_KINDS

    return bool(capture.libraries) or any(kind in ALLOC_KINDS for kind in capture.trace.kinds)


def alive_together(processes: list[dict[str, Any]], own_bytes: int = 0,
                   own_span: tuple[float, float] | None = None) -> int:
    """The most device memory the job's processes hold at one time (nvidia-smi's figure): each
    process that used the device holds its own peak (context + libraries + peak reserved: a
    caching allocator keeps what it reserved) from its start to its end, the job's own process
    `own_bytes` over `own_span` (None: all along); the largest sum over the moments some
    process starts. Children run one after another do not add up; children alive together
    do, with the job's process where it is alive then."""
    spans = [(report["start"], report["end"], report["peak_bytes"])
             for report in processes if report["device"] and report["peak_bytes"]]
    if own_bytes:
        start, end = own_span if own_span is not None else (-math.inf, math.inf)
        spans.append((start, end, own_bytes))
    best = 0
    for moment, _, _ in spans:
        # alive at `moment`: started by then and not yet ended (an end at `moment` is gone)
        total = sum(size for start, end, size in spans if start <= moment < end or (
            start == end == moment))
        best = max(best, total)
    return best


def processes_bytes(processes: list[dict[str, Any]], own_bytes: int = 0,
                    own_span: tuple[float, float] | None = None) -> int:
    """What the job's other processes add to its own device-level peak (`own_bytes`) at the
    moment the processes alive together hold the most (`alive_together`)."""
    return max(0, alive_together(processes, own_bytes, own_span) - own_bytes)


def processes_note(processes: list[dict[str, Any]]) -> str | None:
    """What the estimate did with the job's spawn / forkserver children (None: there were none)."""
    if not processes:
        return None
    from peakmem.estimate.report import human_bytes

    on_device = [report for report in processes if report["device"]]
    idle = len(processes) - len(on_device)
    parts = []
    if on_device:
        each = ", ".join(
            f"{report['name']} (pid {report['pid']}, {report['method']}): "
            f"{human_bytes(report['peak_bytes'])} = context {human_bytes(report['context_bytes'])}"
            f" + libraries {human_bytes(report['library_bytes'])} + reserved "
            f"{human_bytes(report['peak_reserved_bytes'])}"
            + (f" (not simulated: {report['error']})" if report["error"] else "")
            for report in on_device[:8])
        more = f" and {len(on_device) - 8} more" if len(on_device) > 8 else ""
        parts.append(
            f"{len(on_device)} child process(es) the job started ran under the fake GPU with "
            f"CUDA contexts of their own: {each}{more}; peak_bytes (nvidia-smi's figure for "
            "the GPU) is the most the processes alive together hold: each child its own peak "
            "from its start to its end (children run one after another do not add up), the "
            "job's own process its peak all along (its caching allocator keeps what it "
            "reserved: exact when the children run after the job's peak or alongside it, an "
            "upper bound otherwise); peak_reserved_bytes and peak_allocated_bytes are the "
            "job's own process")
    if idle:
        parts.append(f"{idle} child process(es) the job started ran under "
                     "the fake GPU and made no device allocations: they add nothing")
    return "; ".join(parts)
