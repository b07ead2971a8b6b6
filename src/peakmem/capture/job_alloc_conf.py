"""The allocator configuration the job sets for itself, in its own process.

torch reads `PYTORCH_CUDA_ALLOC_CONF` (from 2.10 also `PYTORCH_ALLOC_CONF`, when the first is
unset: `AllocatorRules.conf_variables`) once, when the CUDA caching allocator is initialised:
`CUDAAllocatorConfig::instance()` (c10/cuda/CUDAAllocatorConfig.h, a function-local static that
calls `parseArgs(getenv(...))`) is first reached from the `DeviceCachingAllocator` constructor at
CUDA's lazy initialisation (`torch.cuda._lazy_init`: the first CUDA tensor, or one of the calls
that reach it first, `get_device_name`, `synchronize`, `set_device`, ...: capture.cuda_init_calls). A script that does
`os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"` before that (at its top, the
common idiom) gets that configuration; a setting made after it is ignored for the rest of the
process. A value torch rejects raises RuntimeError at that first use.

The capture follows the same rule: the job's process starts with the configuration being
estimated in its environment (`prepare_environment`: peakmem's `--alloc-conf`, an `env NAME=VALUE`
prefix, else the caller's own), and at the job's first CUDA allocation or initialising call
(`job_conf`) the value torch
would read then is compared with the one at the start: where the job changed it, that is the
configuration of the run (recorded in the trace's metadata as `job_alloc_conf`, used for the
in-job memory readings and the final replay).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, MutableMapping

from peakmem.allocator.rules import AllocatorRules

VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
"""Every name any known torch reads the allocator configuration from."""
META_KEY = "job_alloc_conf"
"""The trace metadata entry holding the configuration the job set itself (absent: it did not)."""


def conf_variables(version: str | None) -> tuple[str, ...]:
    """The variables torch `version` reads, in its order (an unknown version: the newest's)."""
    try:
        return AllocatorRules.for_version(version).conf_variables
    except ValueError:
        return AllocatorRules.for_version(None).conf_variables


def environ_conf(environ: Mapping[str, str | None], version: str | None) -> str | None:
    """The configuration torch `version` reads from `environ` (None: no variable set)."""
    for name in conf_variables(version):
        value = environ.get(name)
        if value is not None:
            return value
    return None


def snapshot(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The allocator variables of `environ` (default: this process's) now."""
    environ = os.environ if environ is None else environ
    return {name: environ.get(name) for name in VARIABLES}


def job_conf(
    start: Mapping[str, str | None], version: str | None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The configuration the job set in its environment since `start` (a `snapshot`), as torch
    `version` reads it now; None where what torch would read is unchanged (the job left it, or
    set a variable this torch does not read, or one the other takes priority over)."""
    now = environ_conf(os.environ if environ is None else environ, version)
    return None if now == environ_conf(start, version) else (now or "")


def changed_variable(start: Mapping[str, str | None],
                     environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(name, value now, '' where removed) of the first allocator variable that differs from
    `start` (a `snapshot`), or None where the job changed none."""
    now = snapshot(environ)
    for name in VARIABLES:
        if now[name] != start.get(name):
            return name, now[name] or ""
    return None


def late_setting_note(name: str, value: str) -> str:
    """The job set its allocator variable itself, but after torch read it (at the job's first
    CUDA use): torch keeps the configuration it started with, and so does the estimate."""
    shown = value if len(value) <= 200 else value[:200] + "..."
    return (f"WARNING: the job set {name}={shown!r} itself after its first CUDA "
            "use, when torch had already read its allocator configuration: torch ignores it, and "
            "the estimate does too (set it before the first CUDA call, or pass --alloc-conf "
            f"{shown!r}, to run with it)")


def prepare_environment(
    conf: str, version: str | None, environ: MutableMapping[str, str] | None = None
) -> None:
    """Put the configuration being estimated in the job's environment before the job runs, where
    it differs from what torch would read there (peakmem's `--alloc-conf`): a job that does
    `os.environ.setdefault(...)` or tests for the variable sees it as it would on the GPU."""
    environ = os.environ if environ is None else environ
    if environ_conf(environ, version) == conf or (not conf and environ_conf(environ, version) is None):
        return
    for name in VARIABLES:
        environ.pop(name, None)
    if conf:
        environ["PYTORCH_CUDA_ALLOC_CONF"] = conf


@contextlib.contextmanager
def job_environment(conf: str | None, version: str | None) -> Iterator[None]:
    """`prepare_environment` for the captures inside the block (None: the environment as it
    is); where that changed this process's variables, they are put back after it."""
    before = snapshot()
    if conf is not None:
        prepare_environment(conf, version)
    changed = snapshot() != before
    try:
        yield
    finally:
        if changed:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
