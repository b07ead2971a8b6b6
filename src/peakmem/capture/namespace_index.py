"""Which loaded modules' namespaces bind one of some objects, without a walk per question.

`capture.side_effects` replaces a save function wherever a loaded module bound it by name, at
the start of every capture: a test of every value of every module namespace (~1 600 modules,
~50 000 values in a bench worker: ~5-10 ms a capture). Between two captures of one process
almost no namespace changes, so `namespaces_binding` keeps, per namespace, the ids of the values
it held when last seen, and re-reads only the namespaces changed since (the ids are kept from
a namespace's second search at one version on: a one-capture process keeps none).

"Changed since" is CPython's own dict version (PEP 509, `ma_version_tag`): every insertion,
rebinding to another object or deletion of a key gives the dict a new version, unique in the
process, and every new dict gets a version no dict had before, so an unchanged version means
the same keys bound to the same objects (which the dict keeps alive: their ids are theirs). A
dict's version is not exposed to Python; it is read from the dict object where CPython 3.11-3.12
keeps it, after checking at import that the layout there is the one expected (`ma_used`, the
length, just before it, and the version moving on a write). Anywhere else (other versions or
implementations, the check failing) every namespace is read every time, as before: the answer
is the same either way, only its cost differs.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable, Collection, Iterator
from typing import Any

_HEAD = object.__basicsize__
"""Bytes of a PyObject header: `ma_used` (Py_ssize_t) follows it, then `ma_version_tag`."""


_VERSION_AT = _HEAD + 8
_U64_AT = ctypes.c_uint64.from_address


def _read_version(namespace: dict) -> int:
    return _U64_AT(id(namespace) + _VERSION_AT).value


def _layout_checked() -> Callable[[dict], int] | None:
    """`_read_version` when this interpreter's dicts keep their version where it reads it."""
    if sys.implementation.name != "cpython" or not (3, 11) <= sys.version_info[:2] <= (3, 12):
        return None
    if ctypes.sizeof(ctypes.c_ssize_t) != 8 or _HEAD != 16:
        return None
    probe: dict[str, object] = {}
    for key in ("a", "b", "c"):
        before = _read_version(probe)
        probe[key] = object()
        used = ctypes.c_ssize_t.from_address(id(probe) + _HEAD).value
        if used != len(probe) or _read_version(probe) == before:
            return None
    before = _read_version(probe)
    probe["a"] = probe["a"]  # the same object: CPython keeps the version (no change)
    kept = _read_version(probe) == before
    del probe["b"]
    return _read_version if kept and _read_version(probe) != before else None


dict_version: Callable[[dict], int] | None = _layout_checked()
"""The version of a dict, or None where it cannot be read (every namespace is then re-read)."""


class NamespaceIndex:
    """Per module namespace, the ids of its values as of its last version seen."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[int, frozenset[int] | None]] = {}
        """id(namespace) -> (its version, the ids of its values then: None until the namespace
        is seen a second time at that version)."""

    def namespaces_binding(self, wanted: Collection[int]) -> Iterator[dict]:
        """The loaded modules' namespaces holding a value whose id is in `wanted`, in
        `sys.modules`' order (each namespace once per module that has it)."""
        wanted_ids = frozenset(wanted)
        read_version = dict_version
        modules = list(sys.modules.values())
        if read_version is None:
            yield from _binding(modules, wanted_ids)
            return
        seen = self._seen
        for module in modules:
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            version = read_version(namespace)
            record = seen.get(id(namespace))
            if record is not None and record[0] == version and record[1] is not None:
                binds = not wanted_ids.isdisjoint(record[1])
            elif record is None or record[0] != version:
                # first seen at this version: read it as before, keep the version only (a
                # process that captures once pays no more than the read)
                binds = not wanted_ids.isdisjoint(map(id, list(namespace.values())))
                seen[id(namespace)] = (version, None)
            else:  # unchanged since last seen: its values' ids kept from now on
                ids = frozenset(map(id, list(namespace.values())))
                seen[id(namespace)] = (version, ids)
                binds = not wanted_ids.isdisjoint(ids)
            if binds:
                yield namespace
        if len(seen) > 2 * len(modules):  # forget the namespaces of modules no longer loaded
            live = {id(getattr(module, "__dict__", None)) for module in modules}
            self._seen = {key: value for key, value in seen.items() if key in live}


def _binding(modules: list[Any], wanted_ids: frozenset[int]) -> Iterator[dict]:
    for module in modules:
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict) and not wanted_ids.isdisjoint(
            map(id, list(namespace.values()))
        ):
            yield namespace


_INDEX = NamespaceIndex()


def namespaces_binding(wanted: Collection[int]) -> Iterator[dict]:
    """`NamespaceIndex.namespaces_binding` with the process's one index."""
    return _INDEX.namespaces_binding(wanted)


def namespaces_binding_uncached(wanted: Collection[int]) -> Iterator[dict]:
    """The same namespaces, every one read now (the reference the tests compare with)."""
    return _binding(list(sys.modules.values()), frozenset(wanted))
