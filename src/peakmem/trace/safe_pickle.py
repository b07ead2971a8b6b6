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
such as EMPTY_DICT make ~64 bytes of objects each. A pickle of more than `PROBE_MIN_BYTES` is
therefore first unpickled in a fresh interpreter (trace/pickle_probe_child.py, fed the bytes on
stdin) limited to `memory_budget(len(data))` bytes of address space beyond the interpreter and
the data, and to half the calling thread's stack: a child that crashes or runs out of memory
refuses the file, and the parent, unpickling the same bytes the same way, is then known to
survive it. Not a fork of the caller: a long-lived caller (an xdist worker, a bench worker) holds
heap it freed but still maps, which a fork's unpickler reuses without growing the address space,
so a fork's cap let a bomb of the budget plus that heap through.
"""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from peakmem.inputs import InputError, one_line
from peakmem.trace.pickle_probe_child import MEMORY_EXIT as _MEMORY_EXIT

ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset()
"""(module, name) pairs a snapshot may name. None: the snapshot format needs no global."""

_PLAIN_ONLY = "a memory snapshot holds only plain data"
PROBE_MIN_BYTES = 4 * 1024
"""Smaller pickles cannot nest deeply enough to overflow the C stack, nor grow large."""
_CHILD = Path(__file__).with_name("pickle_probe_child.py")
_GLIBC_UNLIMITED_THREAD_STACK = 2 * 2**20
"""A new thread's stack where RLIMIT_STACK is unlimited (glibc's ARCH_STACK_DEFAULT_SIZE, x86_64)."""


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
    """Unpickle `data` in a fresh interpreter (trace/pickle_probe_child.py) under a memory limit
    of `memory_budget(len(data))` and a stack of half the calling thread's; refuse it if the
    child crashes or runs out of memory."""
    if len(data) < PROBE_MIN_BYTES or not sys.executable:
        return
    budget = memory_budget(len(data))
    command = [sys.executable, "-I", "-S", str(_CHILD), str(len(data)), str(budget),
               str(probe_stack_bytes())]
    try:
        proc = subprocess.run(command, input=data, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, check=False)
    except OSError as exc:
        raise InputError(
            f"cannot run the unpickling probe ({one_line(exc.strerror or str(exc), 80)})"
        ) from None
    if proc.returncode < 0:
        raise RefusedPickle(
            f"refused: unpickling it crashed the unpickler (signal {-proc.returncode}): "
            "nested too deeply or out of memory; " + _PLAIN_ONLY
        )
    if proc.returncode == _MEMORY_EXIT:
        raise RefusedPickle(
            f"refused: unpickling it needs more than {budget} bytes of memory "
            f"(16 x the file + 1 GiB); " + _PLAIN_ONLY
        )
    if proc.returncode != 0:
        raise InputError(f"the unpickling probe failed (exit code {proc.returncode})")


def probe_stack_bytes() -> int:
    """The probe child's stack: half of what the calling thread has, a margin for the frames the
    caller is already in. The main thread: the RLIMIT_STACK soft limit (0 where it is unlimited:
    the child inherits the same); another thread: its own stack's size (pthread_getattr_np),
    else glibc's default for new threads (that limit, or 2 MiB where it is unlimited)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - POSIX has it
        return 0
    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    unlimited = soft == resource.RLIM_INFINITY
    if threading.current_thread() is threading.main_thread():
        size = 0 if unlimited else soft
    else:
        size = _thread_stack_size() or (_GLIBC_UNLIMITED_THREAD_STACK if unlimited else soft)
    return size // 2


def _thread_stack_size() -> int:
    """The calling thread's stack size from the C library (0 where it cannot say). Not
    `threading.stack_size()`: that is the size of threads created from now on, and calling it
    without an argument sets that to the default."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        get_attr, get_stack = libc.pthread_getattr_np, libc.pthread_attr_getstack
        libc.pthread_self.restype = ctypes.c_ulong
    except (OSError, AttributeError):  # pragma: no cover - not glibc/musl
        return 0
    attr = ctypes.create_string_buffer(256)  # pthread_attr_t: 56 bytes on x86_64, 64 on arm64
    if get_attr(ctypes.c_ulong(libc.pthread_self()), attr) != 0:
        return 0
    address, size = ctypes.c_void_p(), ctypes.c_size_t()
    try:
        found = get_stack(attr, ctypes.byref(address), ctypes.byref(size)) == 0
    finally:
        libc.pthread_attr_destroy(attr)
    return size.value if found else 0
