"""The safe-pickle probe's child: `python -I -S pickle_probe_child.py SIZE BUDGET STACK` reads
SIZE bytes of pickle from stdin and unpickles them under limits (trace/safe_pickle.py runs it).

A fresh interpreter, not a fork of the caller: the caller's freed-but-mapped heap (glibc bins,
pymalloc pools) would count in a fork's "what the process maps" and be reused by the unpickler
without growing the address space, so a fork's cap was larger than the budget by whatever the
caller had freed. Here the address space holds only this interpreter (about 20 MB) and the data.

- RLIMIT_AS: what the process maps once the data is read + BUDGET, so the unpickled objects (and
  the stack) get BUDGET bytes; running out raises MemoryError: exit code `MEMORY_EXIT`.
- RLIMIT_STACK: STACK bytes (0: left as inherited), so a nesting that would overflow the
  caller's stack crashes here (a signal) first.
- Everything the file names is refused (the parent's allow-list is empty, `ALLOWED_GLOBALS`);
  any other error exits 0: the parent unpickles again and reports it itself.

Standard library only (it runs isolated, `-I -S`: no site, no PYTHONPATH, not its own folder).
"""

import io
import os
import pickle
import sys

MEMORY_EXIT = 3
BAD_USAGE_EXIT = 4
_KEPT: list = []


class _PlainData(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("refused: a global")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused: a persistent id")


def _limit(budget: int, stack: int) -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file from a crash
        if stack > 0:
            _lower(resource, resource.RLIMIT_STACK, stack)
        with open("/proc/self/statm") as handle:
            mapped = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        _lower(resource, resource.RLIMIT_AS, mapped + budget)
    except (ImportError, OSError, ValueError):
        pass


def _lower(resource, which: int, limit: int) -> None:
    soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft == resource.RLIM_INFINITY or limit < soft:
        resource.setrlimit(which, (limit, hard))


def main(argv: list) -> int:
    try:
        size, budget, stack = (int(arg) for arg in argv[1:4])
    except ValueError:
        return BAD_USAGE_EXIT
    data = sys.stdin.buffer.read(size)
    _limit(budget, stack)
    try:
        _KEPT.append(_PlainData(io.BytesIO(data)).load())  # freed by no one: os._exit
    except MemoryError:
        return MEMORY_EXIT
    except BaseException:  # noqa: BLE001 - the parent reports ordinary errors itself
        return 0
    return 0


if __name__ == "__main__":
    os._exit(main(sys.argv))  # no teardown of what was unpickled
