"""The warm job process ("zygote"): a long-lived interpreter that has already imported torch,
peakmem's capture modules and any ``--preload`` modules, and forks one fresh child per estimate.

The child then does what a cold job process (``python -c BOOT request.json``,
:func:`peakmem.capture.child.child_command`) does, in the state a cold one reaches after its
imports: its own session, stdin ``/dev/null``, stdout and stderr on the descriptor the supervisor
passed, the requester's working directory, environment and umask, ``sys.argv`` and ``sys.path``
of the cold child, and then :func:`peakmem.capture.child.main` on the same request file. The
zygote itself never runs a capture (a capture's per-process caches start empty in every child).

Only a command of exactly the cold child's shape is run: the zygote executes no code it is
sent. What it must share with the requester to give the same estimate (python, peakmem version
and source, the environment variables read at import time) is :func:`identity`; a request whose
identity differs is refused and the requester starts a cold child instead.

Started by :mod:`peakmem.jobs.zygote_client` as ``python -c ZYGOTE_BOOT CONFIG.json``; the socket
server is :mod:`peakmem.jobs.zygote_server`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import peakmem

PACKAGE_DIR = Path(peakmem.__file__).resolve().parent
SOURCE_DIR = str(PACKAGE_DIR.parent)

# The same sys.path shape as the cold child's boot (capture/child.py): peakmem's source first.
ZYGOTE_BOOT = (
    "import sys; sys.path[0:int(not sys.flags.safe_path)] = [{src!r}]; "
    "from peakmem.jobs.zygote import main; main(sys.argv[1:])"
)

STARTUP_ENV_PREFIXES = (
    "PYTHON", "TORCH", "PYTORCH", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "LD_", "CUDA", "NVIDIA_",
    "HF_", "TRANSFORMERS_", "TOKENIZERS_", "PEAKMEM_",
)
"""Environment variables read when the interpreter, torch or a preloaded library starts: a
child forked from the zygote keeps what the zygote read, so these must match the requester's."""

NOT_STARTUP_ENV = frozenset({
    "PEAKMEM_WARM", "PEAKMEM_RUNTIME_DIR",  # whether / where to find a warm process
    "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR",  # read when used (torch._inductor's cache_dir)
    # the allocator configuration: read by the capture in the job's process, at the job's first
    # CUDA allocation (capture.job_alloc_conf), never by the warm process's imports
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
})
"""Variables of those prefixes that are not part of the identity: the child reads them from the
requester's environment, which it is given."""

CAPTURE_MODULES = (
    "peakmem.capture.child",
    "peakmem.capture.runner",
    "peakmem.capture.result_io",
    "peakmem.capture.fake_memory",
    "peakmem.jobs.child",
    "peakmem.profiles",
)
"""What every cold job process imports before it runs the job."""


def startup_env(env: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in sorted(env.items())
            if name.startswith(STARTUP_ENV_PREFIXES) and name not in NOT_STARTUP_ENV}


def source_fingerprint(package_dir: Path = PACKAGE_DIR) -> str:
    """Changes when any file of peakmem's source changes (an editable install being edited)."""
    digest = hashlib.sha1()
    stack = [str(package_dir)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        stack.append(entry.path)
                elif entry.name.endswith((".py", ".toml", ".json")):
                    info = entry.stat()
                    digest.update(f"{entry.path}:{info.st_mtime_ns}:{info.st_size};".encode())
    return digest.hexdigest()[:16]


def identity(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What a requester and the zygote must share for a forked child to equal a cold one."""
    return {
        "python": sys.executable,
        "peakmem": peakmem.__version__,
        "source": SOURCE_DIR,
        "fingerprint": source_fingerprint(),
        "env": startup_env(os.environ if env is None else env),
    }


def identity_difference(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> str | None:
    """One line saying how two identities differ; None when they are the same."""
    for key, what in (("python", "python"), ("peakmem", "peakmem version"),
                      ("source", "peakmem source directory"),
                      ("fingerprint", "peakmem source (changed since the warm process started)")):
        if mine.get(key) != theirs.get(key):
            return f"a different {what}"
    ours, other = mine.get("env", {}), theirs.get("env", {})
    names = sorted(name for name in set(ours) | set(other) if ours.get(name) != other.get(name))
    if names:
        return f"different start-up environment variables ({', '.join(names[:5])})"
    return None


def job_imports(argv: Sequence[str], cap_bytes: int = 4 << 20) -> list[str]:
    """The top-level packages the job's script imports anywhere in its own source (read, never
    run); empty for `-m module` jobs and unreadable scripts."""
    import ast

    from peakmem.jobs.runner import JobSpec, JobSpecError

    try:
        spec = JobSpec.parse(list(argv))
        if spec.script is None or not os.path.isfile(spec.script):
            return []
        if os.path.getsize(spec.script) > cap_bytes:
            return []
        tree = ast.parse(Path(spec.script).read_bytes())
    except (JobSpecError, OSError, SyntaxError, ValueError):
        return []
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return sorted(names)


def unfit_preloads(preload: Sequence[str], imports: Sequence[str]) -> list[str]:
    """Preloaded modules whose package the job does not import itself. A job forked from a
    warm process with such a module would run with it (and what it imported, e.g. torchvision)
    already loaded where a cold job would not: that job is started cold instead."""
    return [name for name in preload if name.split(".")[0] not in set(imports)]


def cold_child_argv(request_path: str) -> list[str]:
    from peakmem.capture.child import child_command

    return child_command(request_path)


def warm_up(preload: Sequence[str]) -> list[str]:
    """Import what a cold job process imports, then the `preload` modules; the errors of those
    that could not be imported (one line each)."""
    from peakmem.torch_import_modules import record

    record()  # as a cold child does, before the capture's modules (the shadowing check)
    for name in CAPTURE_MODULES:
        importlib.import_module(name)
    from peakmem.capture import vision_ops

    vision_ops.declare_torchvision_ops()  # as the capture does before the job's imports
    errors = []
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - reported by `peakmem warm`, not fatal
            errors.append(f"{name}: {type(exc).__name__}: {exc}"[:300])
    return errors


def environment_changes(before: Mapping[str, str],
                        after: Mapping[str, str]) -> dict[str, str | None]:
    """What the warm-up's imports did to the environment (a library may set a variable when it
    is imported, as Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK): name -> new value, None for
    a removed one. A cold job that imports those libraries makes the same changes itself."""
    changes: dict[str, str | None] = {name: value for name, value in after.items()
                                      if before.get(name) != value}
    changes.update({name: None for name in before if name not in after})
    return changes


def with_changes(env: Mapping[str, str], changes: Mapping[str, str | None]) -> dict[str, str]:
    result = dict(env)
    for name, value in changes.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = value
    return result


def fork_job(argv: Sequence[str], cwd: str, env: Mapping[str, str], umask: int, output_fd: int,
             close_fds: Sequence[int] = (),
             env_changes: Mapping[str, str | None] | None = None) -> int:
    """Fork a child that runs the cold child's command `argv`; its pid (the leader of its own
    session). `argv` must be exactly the cold child's (ValueError otherwise). The child's
    environment is the requester's `env` with the warm-up's `env_changes` made to it."""
    argv = list(argv)
    if len(argv) != 4 or argv[:3] != cold_child_argv(argv[3])[:3]:
        raise ValueError("not a peakmem job process command")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        _become_job_process(argv, cwd, with_changes(env, env_changes or {}), umask, output_fd,
                            close_fds, parent)
        from peakmem.capture.child import main as child_main

        child_main(argv[3:])  # ends the process itself
        code = 0
    except BaseException:  # noqa: BLE001 - nothing of the zygote's may run on in the fork
        with contextlib.suppress(BaseException):
            import traceback

            os.write(2, traceback.format_exc().encode())
    finally:
        os._exit(code)
    return 0  # not reached


def _become_job_process(argv: list[str], cwd: str, env: Mapping[str, str], umask: int,
                        output_fd: int, close_fds: Sequence[int], parent: int) -> None:
    from peakmem.jobs.zygote_leftovers import parent_death_signal

    os.setsid()
    parent_death_signal(parent)  # the warm process killed (kill -9, OOM): the job ends with it
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())  # the server blocks its stop signals
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    for fd in close_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(output_fd, 1)
    os.dup2(output_fd, 2)
    for fd in (null, output_fd):
        if fd > 2:
            os.close(fd)
    os.umask(umask)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    _forget_environment_reads()
    sys.argv = ["-c", *argv[3:]]
    _reseed()


def _forget_environment_reads() -> None:
    """Forget what the warm process read from its own environment and kept: a cold interpreter
    reads the job's. `tempfile` caches the directory TMPDIR / TEMP / TMP named on its first use
    (an import in the warm-up may make it), `time` the TZ it started with."""
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile.tempdir = None
    import time

    time.tzset()


def _reseed() -> None:
    """Fresh random state, as a cold interpreter would have (Python's `random` reseeds itself
    after a fork; numpy's global generator does not)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        with contextlib.suppress(Exception):
            numpy.random.seed()


def main(args: list[str]) -> None:
    """The zygote's entry point: ``CONFIG.json`` holds the socket path, preloads, idle time."""
    from peakmem.jobs.zygote_server import listen, serve

    config = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    with contextlib.suppress(OSError):
        os.unlink(args[0])
    path = Path(config["socket"])
    try:
        listener = listen(path)  # first: a second `peakmem warm` fails here, at once
    except (RuntimeError, OSError) as exc:
        sys.stderr.write(f"peakmem warm: {exc}\n")
        sys.exit(1)
    # a daemon: the process that started it exits now, so the warm process is nobody's child
    # (a supervisor that reaps its own jobs' orphans must never take it for one)
    if os.fork():
        os._exit(0)
    os.setsid()
    # the identity is the environment the warm process started with, before its imports
    # (which may set variables): the requester's must be that one
    started_with, started_identity = dict(os.environ), identity()
    try:
        errors = warm_up(config.get("preload", []))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    serve(
        listener, path,
        identity=started_identity,
        env_changes=environment_changes(started_with, os.environ),
        preload=list(config.get("preload", [])),
        preload_errors=errors,
        idle_seconds=config.get("idle"),
        nonce=str(config.get("nonce", "")),
    )
