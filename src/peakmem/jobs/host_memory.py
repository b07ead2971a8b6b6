"""The default cap on the host memory of a supervised job (``--max-host-memory`` not given).

Without one, a job that allocates more host RAM than the machine has (``bytearray(50 * 2**30)``
in a loop) took the machine with it before the kernel's OOM killer chose a victim (peakmem, an
editor, another user's work). The default is :data:`DEFAULT_FRACTION` of the machine's memory
(``MemTotal``, or the cgroup's memory limit where that is lower: a container's). Override it
with ``--max-host-memory SIZE`` or ``PEAKMEM_MAX_HOST_MEMORY=SIZE`` (``8GiB``, ``500MB``, bytes);
``PEAKMEM_MAX_HOST_MEMORY=off`` leaves jobs uncapped, as before.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

from peakmem.inputs import one_line, parse_size

HOST_MEMORY_ENV = "PEAKMEM_MAX_HOST_MEMORY"
DEFAULT_FRACTION = 0.75
"""Of the machine's memory: what the job's processes may hold resident together by default."""
OFF_WORDS = frozenset({"off", "none", "unlimited"})
CGROUP_LIMIT_FILES = ("/sys/fs/cgroup/memory.max",
                      "/sys/fs/cgroup/memory/memory.limit_in_bytes")


class HostMemorySettingError(ValueError):
    """PEAKMEM_MAX_HOST_MEMORY holds something that is not a size (nor `off`)."""


def machine_memory_bytes(meminfo: str | os.PathLike[str] = "/proc/meminfo",
                         cgroup_files: tuple[str, ...] = CGROUP_LIMIT_FILES) -> int | None:
    """The memory this process's jobs can have: MemTotal, or a lower cgroup limit; None where
    neither can be read (not Linux)."""
    sizes = [size for size in (_mem_total(meminfo), *map(_cgroup_limit, cgroup_files))
             if size is not None]
    if not sizes and hasattr(os, "sysconf"):
        with contextlib.suppress(ValueError, OSError):
            sizes.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return min(sizes) if sizes else None


def _mem_total(path: str | os.PathLike[str]) -> int | None:
    try:
        for line in Path(path).read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith("MemTotal:"):
                words = line.split()
                return int(words[1]) * 1024 if len(words) >= 2 and words[1].isdigit() else None
    except OSError:
        return None
    return None


def _cgroup_limit(path: str) -> int | None:
    try:
        text = Path(path).read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    # "max" (v2) or a number near 2**63 (v1) where there is no limit
    return int(text) if text.isdigit() and 0 < int(text) < 2**60 else None


def default_max_host_memory(env: Mapping[str, str] | None = None) -> int | None:
    """The cap for a job given no --max-host-memory: PEAKMEM_MAX_HOST_MEMORY (a size; `off`:
    None), else DEFAULT_FRACTION of :func:`machine_memory_bytes` (None where that is unknown).
    Raises HostMemorySettingError for a setting that is neither."""
    env = os.environ if env is None else env
    setting = env.get(HOST_MEMORY_ENV, "").strip()
    if setting:
        if setting.lower() in OFF_WORDS:
            return None
        size = parse_size(setting)
        if size is None or size <= 0 or size >= 2**63:
            raise HostMemorySettingError(
                f"{HOST_MEMORY_ENV}={one_line(repr(setting), 60)} is not a size (use e.g. 8GiB, "
                "500MB, a number of bytes, or off)")
        return size
    total = machine_memory_bytes()
    return None if total is None else int(total * DEFAULT_FRACTION)
