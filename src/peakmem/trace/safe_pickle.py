"""Unpickle untrusted memory snapshots without running anything they ask for.

`torch.cuda.memory._dump_snapshot()` writes `pickle.dump(torch.cuda.memory._snapshot())`, and
`_snapshot()` returns what `torch._C._cuda_memorySnapshot` builds: dicts, lists and tuples
(`pool_id`) of str, int, float, bool and None (the C++ `_memory_snapshot_pickled` writes the same
shapes with generic, untagged containers). Every one of those has its own pickle opcode at every
protocol, so a real snapshot asks the unpickler for no global at all: `ALLOWED_GLOBALS` is empty
and `find_class` refuses every class or function a file names (`os.system`, `builtins.eval`,
`subprocess.Popen`, `torch._utils._rebuild_tensor_v2`, ...). Without a callable on its stack a
pickle cannot REDUCE, BUILD with `__setstate__`, or create objects: no code from the file runs.
Persistent ids (what `torch.save` uses for tensor storages) are refused too.

The bytes are read whole (under the input-file cap) and unpickled from memory, so a declared
length larger than the file cannot make the unpickler allocate it.

Plain data can still hurt the C unpickler: a key made of a tuple nested some 10**5 deep makes
`hash()` overflow the C stack (a segfault, 2 bytes of pickle per level), and one-byte opcodes
such as EMPTY_DICT make ~64 bytes of objects each. Where `os.fork` exists, a pickle of more than
`PROBE_MIN_BYTES` is first unpickled in a child process limited to `memory_budget(len(data))`
bytes of address space: a child that crashes or runs out of memory refuses the file, and the
parent, unpickling the same bytes the same way, is then known to survive it.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

from peakmem.inputs import InputError, one_line

ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset()
"""(module, name) pairs a snapshot may name. None: the snapshot format needs no global."""

_PLAIN_ONLY = "a memory snapshot holds only plain data"
PROBE_MIN_BYTES = 4 * 1024
"""Smaller pickles cannot nest deeply enough to overflow the C stack, nor grow large."""
_MEMORY_EXIT = 3


class RefusedPickle(InputError):
    """The pickle asks for something a memory snapshot never contains (code, objects)."""


class PlainDataUnpickler(pickle.Unpickler):
    """An unpickler that builds only dicts, lists, tuples, sets, str, bytes, int, float, bool and
    None: every global outside `ALLOWED_GLOBALS` and every persistent id is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:  # pragma: no cover - the allow-list is empty
            return super().find_class(module, name)
        raise RefusedPickle(
            f"refused: the pickle asks for {one_line(str(module), 80)}.{one_line(str(name), 80)}; "
            f"{_PLAIN_ONLY}"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickle(
            "refused: the pickle asks for a persistent object (torch.save data?); " + _PLAIN_ONLY
        )


def loads_plain(data: bytes) -> Any:
    """Unpickle `data` with `PlainDataUnpickler`. Raises InputError (RefusedPickle for a
    forbidden global) and nothing else."""
    if not data:
        raise InputError("empty file, not a pickled memory snapshot")
    if data[:4] == b"PK\x03\x04":
        raise InputError(
            "a zip archive (torch.save output?), not a pickled memory snapshot "
            "(write one with torch.cuda.memory._dump_snapshot())"
        )
    _probe_in_child(data)
    try:
        return PlainDataUnpickler(io.BytesIO(data)).load()
    except InputError:
        raise
    except MemoryError:
        raise InputError(
            "the pickle declares more data than memory allows (a corrupt or hostile length)"
        ) from None
    except RecursionError:
        raise InputError("the pickle is nested too deeply") from None
    except Exception as exc:  # noqa: BLE001 - no code from the file can run: any failure is bad data
        reason = one_line(str(exc), 120) or type(exc).__name__
        raise InputError(f"not a pickled memory snapshot ({reason})") from None


def memory_budget(size: int) -> int:
    """Bytes of memory unpickling `size` bytes may take: 1 GiB + 16 x the file (a real snapshot
    takes about 5 x its size as Python objects)."""
    return 2**30 + 16 * size


def _probe_in_child(data: bytes) -> None:
    """Unpickle `data` in a forked child under a memory limit; refuse it if the child crashes
    or runs out of memory."""
    if len(data) < PROBE_MIN_BYTES or not hasattr(os, "fork"):
        return
    budget = memory_budget(len(data))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 0
        try:
            _quiet_child(budget)
            PlainDataUnpickler(io.BytesIO(data)).load()
        except MemoryError:
            code = _MEMORY_EXIT
        except BaseException:  # noqa: BLE001 - the parent reports ordinary errors itself
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        raise RefusedPickle(
            f"refused: unpickling it crashed the unpickler (signal {os.WTERMSIG(status)}): "
            "nested too deeply or out of memory; " + _PLAIN_ONLY
        )
    if os.WEXITSTATUS(status) == _MEMORY_EXIT:
        raise RefusedPickle(
            f"refused: unpickling it needs more than {budget} bytes of memory "
            f"(16 x the file + 1 GiB); " + _PLAIN_ONLY
        )


def _quiet_child(budget: int) -> None:  # pragma: no cover - runs in the child
    """No fault handler output and no stdio from the probe; address space capped at what the
    process already maps plus `budget`."""
    import faulthandler

    faulthandler.disable()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        import resource

        with open("/proc/self/statm") as handle:
            mapped = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file from a crash
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = mapped + budget
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        if soft == resource.RLIM_INFINITY or limit < soft:
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, OSError, ValueError):
        pass
