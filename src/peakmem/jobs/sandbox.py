"""`--sandbox`: run the job's process without network, with the filesystem read-only except a
scratch directory, and with resource limits. Linux only; it fails closed.

Backends, tried in order (:data:`BACKENDS`):

- ``bwrap`` (bubblewrap), when installed: ``--unshare-all`` (user, network, mount, pid, ipc, uts,
  cgroup namespaces), ``/`` bound read-only, a minimal ``/dev``, a new ``/proc``, all capabilities
  dropped, no further user namespaces, a new session (no terminal injection).
- ``unshare`` (util-linux): user + network + mount + pid + ipc + uts namespaces; a setup script
  (:data:`UNSHARE_SETUP`) remounts every mount read-only, binds the scratch directory writable,
  replaces ``/dev`` with a minimal one (null, zero, full, random, urandom, tty and a private
  ``/dev/shm``), then runs the job in a nested user namespace (which locks those mounts) with
  every capability dropped (``setpriv``, when installed).

Both hide ``/run`` (service sockets such as docker's) behind an empty tmpfs unless the job needs
a path under it. The job keeps reading what the user can read (Python, torch, peakmem, the
script, the data): it runs as the same user. `TMPDIR` points into the scratch directory; `/tmp`
itself is read-only.

Limits (:class:`SandboxLimits`): CPU seconds, file size, open files and core dumps are rlimits
set by :meth:`Sandbox.preexec_fn` (pass it to ``subprocess.Popen``); the process count is an
``RLIMIT_NPROC`` set inside the sandbox's user namespace (``prlimit``), so only the job's own
processes count. The kernel does not apply ``RLIMIT_NPROC`` to root (uid 0); the unshare backend
then bounds the job's pid namespace instead (``kernel.pid_max``, Linux 6.14+; at least 301).

:meth:`Sandbox.probe` runs a tiny command in the sandbox and checks that it holds (``/`` is
read-only, the scratch directory is writable, no network interface but ``lo``); anything else
yields :class:`SandboxUnavailable` with the reason, and ``peakmem estimate --sandbox`` exits 3.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

EXIT_CODE = 3
ERROR_KIND = "unsupported"
SETUP_FAILED = 125
"""Exit status of the unshare backend's setup script when it cannot build the sandbox."""

HIDDEN_DIRS = ("/run",)
"""Replaced by an empty tmpfs inside the sandbox (unless a path the job needs is under one)."""


class SandboxUnavailable(Exception):
    """The sandbox cannot be provided here; `reason` says why. The CLI maps it to exit 3."""

    kind = ERROR_KIND
    exit_code = EXIT_CODE

    def __init__(self, reason: str) -> None:
        self.reason = " ".join(reason.split())
        super().__init__(f"peakmem: --sandbox is not available here: {self.reason}")


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int | None = 4 * 3600
    """CPU time of each process (SIGXCPU, then SIGKILL one second later)."""
    file_bytes: int | None = 64 * 2**30
    """Largest file the job may write (EFBIG past it)."""
    open_files: int | None = 4096
    processes: int | None = 4096
    """Processes and threads of the job together (its torch threads count)."""

    def apply(self) -> None:
        """Set the rlimits on this process (call it in the child before exec)."""
        _set_limit(resource.RLIMIT_CORE, 0)
        if self.cpu_seconds is not None:
            _set_limit(resource.RLIMIT_CPU, self.cpu_seconds, self.cpu_seconds + 1)
        if self.file_bytes is not None:
            _set_limit(resource.RLIMIT_FSIZE, self.file_bytes)
        if self.open_files is not None:
            _set_limit(resource.RLIMIT_NOFILE, self.open_files)


def _set_limit(which: int, soft: int, hard: int | None = None) -> None:
    _, current_hard = resource.getrlimit(which)
    hard = soft if hard is None else hard
    if current_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, current_hard), min(hard, current_hard)
    resource.setrlimit(which, (soft, hard))


# The unshare backend's setup, run as pid 1 of the new namespaces by `sh -c`:
# $1 scratch dir, $2 process limit, $3 pid_max, $4 dirs to hide, then the tools (absolute paths)
# mount, prlimit, unshare and setpriv (or ""), then the job.
UNSHARE_SETUP = r"""
set -u
fail() { echo "peakmem: --sandbox is not available here: $*" >&2; exit 125; }
scratch=$1; procs=$2; pidmax=$3; hide=$4; mount=$5; prlimit=$6; unshare=$7; setpriv=$8; shift 8
mounts=$(cat /proc/self/mountinfo) || fail "cannot read /proc/self/mountinfo"
while read -r _id _parent _dev _root point options _rest; do
  point=$(printf '%b' "$point")
  case "$point" in /proc|/proc/*) continue;; esac
  case ",$options," in *,ro,*) continue;; esac
  "$mount" -n -o "remount,bind,$options,ro" "$point" 2>/dev/null || [ ! -e "$point" ] \
    || fail "cannot make $point read-only"
done <<MOUNTS
$mounts
MOUNTS
"$mount" -n --bind "$scratch" "$scratch" && "$mount" -n -o remount,bind,rw,nosuid,nodev "$scratch" \
  || fail "cannot mount the scratch directory $scratch writable"
dev=$(mktemp -d "$scratch/.peakmem-dev.XXXXXX") && "$mount" -n -t tmpfs -o nosuid,noexec,mode=755 tmpfs "$dev" \
  || fail "cannot mount a tmpfs"
for node in null zero full random urandom tty; do
  : > "$dev/$node" && "$mount" -n --bind "/dev/$node" "$dev/$node" || fail "cannot bind /dev/$node"
done
mkdir "$dev/shm" && "$mount" -n -t tmpfs -o nosuid,nodev,mode=1777 tmpfs "$dev/shm" \
  || fail "cannot mount /dev/shm"
ln -s /proc/self/fd "$dev/fd" && ln -s /proc/self/fd/0 "$dev/stdin" \
  && ln -s /proc/self/fd/1 "$dev/stdout" && ln -s /proc/self/fd/2 "$dev/stderr" \
  || fail "cannot populate /dev"
"$mount" -n --move "$dev" /dev || fail "cannot replace /dev"
rmdir "$dev"
for dir in $hide; do
  [ -d "$dir" ] || continue
  "$mount" -n -t tmpfs -o nosuid,nodev,noexec,mode=755,size=64k tmpfs "$dir" || fail "cannot hide $dir"
done
echo "$pidmax" > /proc/sys/kernel/pid_max 2>/dev/null || true
if [ -n "$setpriv" ]; then
  set -- "$setpriv" --no-new-privs --bounding-set=-all --inh-caps=-all "$@"
fi
"$prlimit" --nproc="$procs" -- "$unshare" --user --map-root-user --mount -- "$@"
"""

# Run inside the sandbox by probe(): every check it needs to hold, or a line saying which failed.
PROBE = r"""
import os, resource, socket, sys
scratch = sys.argv[1]
if not os.statvfs("/").f_flag & os.ST_RDONLY:
    sys.exit("the root filesystem stayed writable")
with open(os.path.join(scratch, "probe"), "w") as f:
    f.write("ok")
names = sorted(name for _, name in socket.if_nameindex())
if names != ["lo"]:
    sys.exit("the network stayed reachable (interfaces: " + ", ".join(names) + ")")
print("peakmem-sandbox-ok")
"""


@dataclass(frozen=True)
class Backend:
    name: str
    required: tuple[str, ...]
    optional: tuple[str, ...]
    build: Callable[[Sandbox, list[str], Path, list[str]], list[str]]


def _bwrap(sandbox: Sandbox, argv: list[str], scratch: Path, hide: list[str]) -> list[str]:
    tools = sandbox.tools
    command = [
        tools["bwrap"], "--unshare-all", "--unshare-user", "--disable-userns",
        "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/dev/shm",
    ]
    for directory in hide:
        command += ["--tmpfs", directory]
    command += ["--bind", str(scratch), str(scratch), "--"]
    return command + sandbox.process_limit(argv)


def _unshare(sandbox: Sandbox, argv: list[str], scratch: Path, hide: list[str]) -> list[str]:
    tools = sandbox.tools
    processes = sandbox.limits.processes
    return [
        tools["unshare"], "--user", "--map-root-user", "--net", "--mount", "--ipc", "--uts",
        "--pid", "--fork", "--kill-child", "--mount-proc", "--",
        tools["sh"], "-c", UNSHARE_SETUP, "peakmem-sandbox", str(scratch),
        str(processes) if processes is not None else "unlimited",
        str(max(processes, 301)) if processes is not None else "",
        " ".join(hide), tools["mount"], tools["prlimit"], tools["unshare"],
        tools.get("setpriv", ""), *argv,
    ]


BACKENDS: dict[str, Backend] = {
    "bwrap": Backend("bwrap", ("bwrap", "prlimit"), (), _bwrap),
    "unshare": Backend("unshare", ("unshare", "sh", "mount", "prlimit"), ("setpriv",), _unshare),
}


@dataclass(frozen=True)
class Sandbox:
    """A way to run a command sandboxed on this machine (found by :meth:`probe`).

    Use::

        command = sandbox.wrap(argv, scratch, env)
        subprocess.Popen(command, env=sandbox.environment(scratch, env),
                         preexec_fn=sandbox.preexec_fn, ...)

    The job's result file belongs in `scratch` (or an inherited fd: `pass_fds` works through
    both backends). A job killed by signal N makes the command exit with 128 + N
    (:meth:`job_status` decodes it).
    """

    backend: str
    tools: dict[str, str] = field(default_factory=dict)
    limits: SandboxLimits = field(default_factory=SandboxLimits)

    @classmethod
    def probe(
        cls,
        limits: SandboxLimits | None = None,
        backends: Sequence[str] = tuple(BACKENDS),
        *,
        path: str | None = None,
        timeout: float = 60,
    ) -> Sandbox | SandboxUnavailable:
        """The first backend that works here, checked by running a tiny command in it; or why
        none does. `path`: where to look for the tools (default: $PATH)."""
        limits = limits or SandboxLimits()
        if not sys.platform.startswith("linux"):
            return SandboxUnavailable(f"it needs Linux namespaces; this is {sys.platform}")
        reasons = []
        for name in backends:
            backend = BACKENDS[name]
            missing = [tool for tool in backend.required if shutil.which(tool, path=path) is None]
            if missing:
                reasons.append(f"{name}: {', '.join(missing)} not installed")
                continue
            tools = {
                tool: shutil.which(tool, path=path)
                for tool in (*backend.required, *backend.optional)
                if shutil.which(tool, path=path) is not None
            }
            sandbox = cls(backend=name, tools=tools, limits=limits)  # type: ignore[arg-type]
            failure = sandbox._check(timeout)
            if failure is None:
                return sandbox
            reasons.append(f"{name}: {failure}")
        if not reasons:
            reasons.append("no sandbox backend was allowed")
        return SandboxUnavailable("; ".join(reasons))

    def _check(self, timeout: float) -> str | None:
        with tempfile.TemporaryDirectory(prefix="peakmem-sandbox-probe-") as scratch:
            argv = [sys.executable, "-I", "-S", "-c", PROBE, scratch]
            try:
                done = self.run(argv, Path(scratch), timeout=timeout)
            except (OSError, subprocess.SubprocessError) as exc:
                return f"could not run a command in it ({exc})"
            if "peakmem-sandbox-ok" in done.stdout and done.returncode == 0:
                if Path(scratch, "probe").read_text() == "ok":
                    return None
                return "the scratch directory was not writable"
            lines = (done.stderr or done.stdout).strip().splitlines()
            why = lines[-1] if lines else f"exit status {done.returncode}"
            return why.removeprefix("peakmem: --sandbox is not available here: ")

    # -- running a command in it -------------------------------------------------------------

    def wrap(
        self, argv: Sequence[str], scratch: Path, env: Mapping[str, str] | None = None
    ) -> list[str]:
        """The command line running `argv` in the sandbox, writable only in `scratch` (made
        here, with a tmp/ inside). `env`: the job's environment (paths it names stay
        visible)."""
        scratch = Path(scratch).resolve()
        (scratch / "tmp").mkdir(parents=True, exist_ok=True)
        needed = [scratch, Path.cwd(), Path(sys.prefix), Path(sys.base_prefix)]
        needed += [Path(p) for p in (env or os.environ).get("PYTHONPATH", "").split(os.pathsep) if p]
        needed += [Path(a) for a in argv if os.path.isabs(a)]
        hide = [d for d in HIDDEN_DIRS if not any(_under(p, Path(d)) for p in needed)]
        return BACKENDS[self.backend].build(self, list(argv), scratch, hide)

    def environment(
        self, scratch: Path, env: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """`env` (default: this process's) for a job in the sandbox: temporary files in the
        scratch directory, no bytecode writes, Hugging Face libraries offline (no network)."""
        result = dict(os.environ if env is None else env)
        tmp = str(Path(scratch).resolve() / "tmp")
        result.update({
            "TMPDIR": tmp, "TMP": tmp, "TEMP": tmp, "PYTHONDONTWRITEBYTECODE": "1",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "PEAKMEM_SANDBOX": self.backend,
        })
        return result

    def preexec_fn(self) -> None:
        """For `subprocess.Popen(preexec_fn=...)`: the rlimits."""
        self.limits.apply()

    def process_limit(self, argv: list[str]) -> list[str]:
        """`argv` under the process limit (set inside the sandbox: see the module docs)."""
        if self.limits.processes is None:
            return argv
        return [self.tools["prlimit"], f"--nproc={self.limits.processes}", "--", *argv]

    def run(
        self,
        argv: Sequence[str],
        scratch: Path,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        **kwargs: object,
    ) -> subprocess.CompletedProcess:
        """Run `argv` in the sandbox to completion (text output captured)."""
        return subprocess.run(
            self.wrap(argv, scratch, env),
            env=self.environment(scratch, env),
            preexec_fn=self.preexec_fn,
            capture_output=True,
            text=True,
            timeout=timeout,
            **kwargs,  # type: ignore[arg-type]
        )

    @property
    def process_limit_binds_root(self) -> bool:
        """Whether the process limit holds for a job run by root (uid 0): only through the
        unshare backend's pid namespace bound."""
        return self.backend == "unshare"

    @staticmethod
    def job_status(returncode: int) -> tuple[int | None, int | None]:
        """(exit status, signal number) of the job from the sandbox command's return code."""
        if returncode < 0:
            return None, -returncode
        if returncode > 128 and returncode - 128 in signal.valid_signals():
            return None, returncode - 128
        return returncode, None


def _under(path: Path, directory: Path) -> bool:
    try:
        Path(os.path.abspath(path)).relative_to(directory)
    except ValueError:
        return False
    return True


def sandbox_for_cli(enabled: bool, limits: SandboxLimits | None = None) -> Sandbox | None:
    """`--sandbox`: the sandbox to run the job in (None without the flag). Raises
    :class:`SandboxUnavailable` (exit 3, kind "unsupported") where it cannot be provided."""
    if not enabled:
        return None
    found = Sandbox.probe(limits)
    if isinstance(found, SandboxUnavailable):
        raise found
    return found
