"""Patch a library module for the capture's duration, whether the job imported it before the
capture or imports it during it (a meta-path finder wraps the module's loader)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

Undo = Callable[[], None]
Apply = Callable[[Any], Undo]


class ImportHook(importlib.abc.MetaPathFinder):
    """A meta-path finder that runs `on_load(module)` right after any of the modules `names` is
    executed (the module's own loader does the loading)."""

    def __init__(self, names: Collection[str], on_load: Callable[[Any], None]) -> None:
        self.names = frozenset(names)
        self.on_load = on_load
        self._busy = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.names or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, on_load = spec.loader, self.on_load

        class Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                on_load(module)

            def __getattr__(self, attr: str) -> Any:  # get_source, resource readers, ...
                return getattr(loader, attr)

        spec.loader = Loader()
        return spec


@contextmanager
def patch_on_import(name: str, apply: Apply) -> Iterator[None]:
    """`apply(module)` once module `name` is loaded (now, or when the job imports it); its undo
    runs when the context ends."""
    undos: list[Undo] = []

    def on_load(module: Any) -> None:
        undos.append(apply(module))

    finder = ImportHook((name,), on_load)
    if name in sys.modules:
        on_load(sys.modules[name])
    else:
        sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        for undo in reversed(undos):
            undo()
