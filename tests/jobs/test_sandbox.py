"""--sandbox: what the job can touch inside it, and failing closed where it cannot be had."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from peakmem.jobs import sandbox as sandbox_module
from peakmem.jobs.sandbox import (
    BACKENDS,
    Sandbox,
    SandboxLimits,
    SandboxUnavailable,
    sandbox_for_cli,
)

_PROBED: dict[tuple, object] = {}


def _sandbox(backend: str, limits: SandboxLimits | None = None) -> Sandbox:
    key = (backend, limits)
    if key not in _PROBED:
        _PROBED[key] = Sandbox.probe(limits, backends=(backend,))
    found = _PROBED[key]
    if isinstance(found, SandboxUnavailable):
        pytest.skip(f"this machine cannot provide the {backend} sandbox: {found.reason}")
    return found


@pytest.fixture(params=list(BACKENDS))
def backend(request) -> str:
    return request.param


def _python(sandbox: Sandbox, code: str, scratch: Path, timeout: float = 60, **kwargs):
    argv = [sys.executable, "-I", "-S", "-c", textwrap.dedent(code)]
    return sandbox.run(argv, scratch, timeout=timeout, **kwargs)


def _attempts(code: str) -> str:
    """Wrap checks so each reports ok or the OSError it raised."""
    return (
        "import json, os, sys\nresults = {}\n"
        "def attempt(name, fn):\n"
        "    try:\n        fn(); results[name] = 'ok'\n"
        "    except OSError as exc:\n        results[name] = exc.__class__.__name__ + ': ' + str(exc)\n"
        + textwrap.dedent(code)
        + "\nprint(json.dumps(results))\n"
    )


def _write(path: str) -> None:
    with open(path, "w") as file:
        file.write("x")


def test_only_the_scratch_directory_is_writable(backend, tmp_path, monkeypatch):
    sandbox = _sandbox(backend)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    scratch = tmp_path / "scratch"
    home = Path.home()
    code = _attempts(f"""
        def write(path):
            with open(path, "w") as f:
                f.write("x")
        attempt("scratch", lambda: write({str(scratch / "result.json")!r}))
        attempt("tmpdir", lambda: write(os.path.join(os.environ["TMPDIR"], "t")))
        attempt("cwd", lambda: write("escaped.txt"))
        attempt("home", lambda: write({str(home / ".peakmem-sandbox-escape")!r}))
        attempt("tmp", lambda: write("/tmp/peakmem-sandbox-escape"))
        attempt("devnull", lambda: write("/dev/null"))
        attempt("devshm", lambda: write("/dev/shm/peakmem-sandbox"))
        attempt("mkdir_root", lambda: os.mkdir("/peakmem-sandbox-escape"))
        attempt("read_cwd", lambda: open({str(work / "input.txt")!r}).read())
    """)
    (work / "input.txt").write_text("data")
    done = _python(sandbox, code, scratch)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["scratch"] == "ok" and results["tmpdir"] == "ok"
    assert results["devnull"] == "ok" and results["devshm"] == "ok"
    assert results["read_cwd"] == "ok"
    for name in ("cwd", "home", "tmp", "mkdir_root"):
        assert results[name] != "ok", name
    assert (scratch / "result.json").read_text() == "x"
    assert not (work / "escaped.txt").exists()
    assert not (home / ".peakmem-sandbox-escape").exists()
    assert not Path("/tmp/peakmem-sandbox-escape").exists()
    assert not Path("/peakmem-sandbox-escape").exists()


def test_the_job_cannot_undo_the_read_only_mounts(backend, tmp_path):
    sandbox = _sandbox(backend)
    code = """
        import subprocess, sys
        mounts = subprocess.run(["mount", "-o", "remount,rw", "/"], capture_output=True)
        unshare = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                                  "mount -o remount,rw / && touch /peakmem-sandbox-escape"],
                                 capture_output=True)
        print(mounts.returncode, unshare.returncode)
    """
    done = _python(sandbox, code, tmp_path / "scratch")
    assert done.returncode == 0, done.stderr
    remount, nested = done.stdout.split()
    assert remount != "0" and nested != "0"
    assert not Path("/peakmem-sandbox-escape").exists()


def test_no_network(backend, tmp_path):
    sandbox = _sandbox(backend)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []

    server.settimeout(0.2)

    def accept():
        deadline = time.monotonic() + 30
        while not stop.is_set() and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                accepted.append(server.accept())

    stop = threading.Event()
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    code = _attempts(f"""
        import socket
        attempt("loopback", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=5))
        attempt("outside", lambda: socket.create_connection(("1.1.1.1", 80), timeout=5))
    """)
    try:
        done = _python(sandbox, code, tmp_path / "scratch")
    finally:
        stop.set()
        thread.join(5)
        server.close()
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["loopback"] != "ok" and results["outside"] != "ok"
    assert not accepted
    # the same connection works outside the sandbox: the server was reachable
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    socket.create_connection(server.getsockname(), timeout=5).close()
    server.close()


def test_the_process_limit_stops_a_fork_bomb(backend, tmp_path):
    sandbox = _sandbox(backend, SandboxLimits(processes=40))
    if os.geteuid() == 0 and not sandbox.process_limit_binds_root:
        pytest.skip(f"RLIMIT_NPROC does not bind root (uid 0), and {backend} has no other bound")
    code = """
        import os, signal, sys, time
        children, error = [], None
        for _ in range(700):
            try:
                pid = os.fork()
            except OSError as exc:
                error = exc.__class__.__name__
                break
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            children.append(pid)
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        print(len(children), error)
    """
    done = _python(sandbox, code, tmp_path / "scratch", timeout=120)
    assert done.returncode == 0, done.stderr
    count, error = done.stdout.split()
    assert error == "BlockingIOError"  # EAGAIN
    # root is bounded by the pid namespace (pid_max is at least 301), others by RLIMIT_NPROC
    assert int(count) < (301 if os.geteuid() == 0 else 40)


def test_the_cpu_time_limit_kills_a_busy_loop(backend, tmp_path):
    sandbox = _sandbox(backend, SandboxLimits(cpu_seconds=1))
    start = time.monotonic()
    done = _python(sandbox, "while True:\n    pass\n", tmp_path / "scratch", timeout=120)
    assert time.monotonic() - start < 100
    exit_status, signum = Sandbox.job_status(done.returncode)
    assert exit_status is None
    assert signum in (signal.SIGXCPU, signal.SIGKILL)


def test_file_size_and_open_file_limits(backend, tmp_path):
    sandbox = _sandbox(backend, SandboxLimits(file_bytes=4096, open_files=64))
    scratch = tmp_path / "scratch"
    code = _attempts(f"""
        import resource
        def big():
            with open({str(scratch / "big")!r}, "wb") as f:
                f.write(b"x" * 100000)
        attempt("big", big)
        handles = []
        attempt("files", lambda: [handles.append(open("/dev/null")) for _ in range(200)])
        results["nofile"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        results["core"] = resource.getrlimit(resource.RLIMIT_CORE)[1]
    """)
    done = _python(sandbox, code, scratch)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert "File too large" in results["big"]
    assert "Too many open files" in results["files"]
    assert results["nofile"] == 64 and results["core"] == 0


def test_the_job_can_import_peakmem_and_get_its_result_out(backend, tmp_path):
    sandbox = _sandbox(backend)
    scratch = tmp_path / "scratch"
    src = str(Path(sandbox_module.__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": src}
    code = f"""
        import json, os, peakmem
        from peakmem.trace.events import Trace
        with open({str(scratch / "result.json")!r}, "w") as f:
            json.dump({{"version": peakmem.__version__, "sandbox": os.environ["PEAKMEM_SANDBOX"],
                        "tmp": os.environ["TMPDIR"]}}, f)
    """
    argv = [sys.executable, "-c", textwrap.dedent(code)]
    done = sandbox.run(argv, scratch, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads((scratch / "result.json").read_text())
    assert result["sandbox"] == backend
    assert result["tmp"] == str(scratch.resolve() / "tmp")


def test_exit_status_and_signals_come_back(backend, tmp_path):
    sandbox = _sandbox(backend)
    done = _python(sandbox, "import sys; sys.exit(7)", tmp_path / "s1")
    assert Sandbox.job_status(done.returncode) == (7, None)
    done = _python(sandbox, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", tmp_path / "s2")
    assert Sandbox.job_status(done.returncode) == (None, signal.SIGSEGV)


def test_an_inherited_fd_reaches_the_job(backend, tmp_path):
    sandbox = _sandbox(backend)
    read, write = os.pipe()
    try:
        code = f"import os; os.write({write}, b'result')"
        done = _python(sandbox, code, tmp_path / "scratch", pass_fds=(write,))
    finally:
        os.close(write)
    with os.fdopen(read, "rb") as pipe:
        assert pipe.read() == b"result"
    assert done.returncode == 0, done.stderr


# -- failing closed -----------------------------------------------------------------------------


def test_without_the_tools_the_sandbox_fails_closed(tmp_path):
    found = Sandbox.probe(path=str(tmp_path))  # an empty PATH: neither bwrap nor unshare
    assert isinstance(found, SandboxUnavailable)
    assert str(found).startswith("peakmem: --sandbox is not available here: ")
    assert "bwrap" in found.reason and "unshare" in found.reason
    assert found.exit_code == 3 and found.kind == "unsupported"
    assert "\n" not in str(found)


def test_a_sandbox_that_does_not_hold_is_refused(tmp_path, monkeypatch):
    """A backend whose command runs but does not isolate (here: runs the job unsandboxed)."""

    def leaky(sandbox, argv, scratch, hide):
        return list(argv)

    monkeypatch.setitem(
        BACKENDS, "leaky", sandbox_module.Backend("leaky", ("sh",), (), leaky)
    )
    found = Sandbox.probe(backends=("leaky",))
    assert isinstance(found, SandboxUnavailable)
    assert "leaky" in found.reason
    assert "root filesystem stayed writable" in found.reason or "network" in found.reason


def test_a_backend_that_cannot_start_is_refused(tmp_path, monkeypatch):
    def broken(sandbox, argv, scratch, hide):
        return ["sh", "-c", "echo 'unshare: unshare failed: Operation not permitted' >&2; exit 1"]

    monkeypatch.setitem(
        BACKENDS, "broken", sandbox_module.Backend("broken", ("sh",), (), broken)
    )
    found = Sandbox.probe(backends=("broken",))
    assert isinstance(found, SandboxUnavailable)
    assert found.reason == "broken: unshare: unshare failed: Operation not permitted"


def test_sandbox_for_cli(monkeypatch):
    assert sandbox_for_cli(False) is None
    monkeypatch.setattr(
        Sandbox, "probe", classmethod(lambda cls, limits=None: SandboxUnavailable("no namespaces"))
    )
    with pytest.raises(SandboxUnavailable) as raised:
        sandbox_for_cli(True)
    assert str(raised.value) == "peakmem: --sandbox is not available here: no namespaces"
    assert raised.value.exit_code == 3


def test_non_linux_fails_closed(monkeypatch):
    monkeypatch.setattr(sandbox_module.sys, "platform", "darwin")
    found = Sandbox.probe()
    assert isinstance(found, SandboxUnavailable) and "darwin" in found.reason


def test_job_status_decoding():
    assert Sandbox.job_status(0) == (0, None)
    assert Sandbox.job_status(1) == (1, None)
    assert Sandbox.job_status(128 + 9) == (None, 9)
    assert Sandbox.job_status(-15) == (None, 15)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_hidden_dirs_stay_when_the_job_needs_them(tmp_path):
    sandbox = Sandbox(backend="bwrap", tools={"bwrap": "bwrap", "prlimit": "prlimit"})
    assert "/run" in sandbox.wrap(["python", "x.py"], tmp_path)
    assert "/run" not in sandbox.wrap(["python", "/run/user/1/x.py"], tmp_path)


def test_killing_the_sandbox_command_kills_the_job(backend, tmp_path):
    """The supervisor's timeout kills the command it started: nothing of the job may live on."""
    sandbox = _sandbox(backend)
    scratch = tmp_path / "scratch"
    beat = scratch / "beat"
    code = textwrap.dedent(f"""
        import os, time
        if os.fork() == 0:  # a grandchild too
            time.sleep(600)
        while True:
            with open({str(beat)!r}, "a") as f:
                f.write(".")
            time.sleep(0.05)
    """)
    argv = [sys.executable, "-I", "-S", "-c", code]
    process = subprocess.Popen(
        sandbox.wrap(argv, scratch), env=sandbox.environment(scratch),
        preexec_fn=sandbox.preexec_fn,
    )
    try:
        deadline = time.monotonic() + 30
        while not (beat.exists() and beat.stat().st_size > 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert beat.exists(), "the job never started"
    finally:
        process.kill()
        process.wait()
    time.sleep(0.5)
    size = beat.stat().st_size
    time.sleep(0.5)
    assert beat.stat().st_size == size


def test_a_scratch_path_with_spaces(backend, tmp_path):
    sandbox = _sandbox(backend)
    scratch = tmp_path / "my scratch dir"
    code = f"open({str(scratch / 'out.txt')!r}, 'w').write('ok')"
    done = _python(sandbox, code, scratch)
    assert done.returncode == 0, done.stderr
    assert (scratch / "out.txt").read_text() == "ok"
