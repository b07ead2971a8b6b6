"""Put back the interpreter state a job may break for the code that runs after it.

A job runs in peakmem's process, and once its own code is over peakmem still has work there
(undoing its patches, resetting dynamo, formatting the job's traceback, writing the result).
Python lets a finished job leave the interpreter unusable for that: `builtins.__import__`
rebound to a function that raises, `del sys.modules["torch"]` (the next `import torch` loads a
second torch, which fails registering its operator libraries again), `torch.cuda = None`. Each
is a valid job under python (its process ends right after); under peakmem each was
"peakmem internal error in the job's process".

:func:`interpreter_state_restored` snapshots, before the job runs, the names of `builtins`,
the entries of `sys.modules` and the submodule attributes of `torch`, and puts back each one
the job removed or rebound as soon as the job's code is over, before any of peakmem's code runs
again. What the job added is left alone. Its atexit handlers run later and see the restored
state, as the rest of peakmem does.
"""

from __future__ import annotations

import builtins
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

_GUARDED_PACKAGES = ("torch",)
"""Packages whose module-valued attributes (`torch.cuda`, `torch.nn`) are put back."""


def _module_attributes(package: ModuleType) -> dict[str, ModuleType]:
    return {name: value for name, value in vars(package).items() if isinstance(value, ModuleType)}


def _restore_mapping(target: Any, before: dict[str, Any]) -> None:
    """Set every key of `before` in `target` (a dict, or a module via setattr) back to its
    value where the job removed it or bound another object."""
    setter = target.__setitem__ if isinstance(target, dict) else (
        lambda name, value: setattr(target, name, value))
    current = target if isinstance(target, dict) else vars(target)
    for name, value in before.items():
        if current.get(name, _MISSING) is not value:
            setter(name, value)


_MISSING = object()


@contextmanager
def interpreter_state_restored() -> Iterator[None]:
    builtins_before = dict(vars(builtins))
    modules = sys.modules  # `sys.modules = {}` rebinds the name, not the import system's dict
    modules_before = dict(modules)
    packages = [(sys.modules[name], _module_attributes(sys.modules[name]))
                for name in _GUARDED_PACKAGES if isinstance(sys.modules.get(name), ModuleType)]
    try:
        yield
    finally:
        _restore_mapping(vars(builtins), builtins_before)
        sys.modules = modules
        _restore_mapping(modules, modules_before)
        for package, attributes in packages:
            _restore_mapping(package, attributes)
