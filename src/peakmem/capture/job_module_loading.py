"""CUDA_MODULE_LOADING as the job's process has it when CUDA starts.

The CUDA driver reads CUDA_MODULE_LOADING once, at `cuInit`, which torch reaches at CUDA's lazy
initialisation (the job's first CUDA tensor or initialising call: capture.cuda_init_calls; torch
sets it to LAZY first when it is unset). EAGER loads every kernel image of the process's
libraries at context creation: a larger context (profiles/loader.py `module_loading`,
data/contexts/cuda_context.toml) and no lazily loaded first-use memory. A job that sets it at its
top (`os.environ["CUDA_MODULE_LOADING"] = "EAGER"`) runs eagerly; one that sets it after its first
CUDA tensor does not. The capture records the job's value at CUDA's initialisation and the one
its process started with (both in the trace, `META_KEY`); the estimate's context and first-use
figures follow the value at initialisation (`environ_for`), with a note where the job changed it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

VARIABLE = "CUDA_MODULE_LOADING"
META_KEY = "cuda_module_loading"
"""trace.meta: {"start": the job process's value at its start, "init": the value at CUDA's
initialisation} ("" for unset); absent where the job never initialised CUDA."""


def start_value() -> str | None:
    """The variable as the job's process starts (before the job's own code)."""
    return os.environ.get(VARIABLE)


def record_at_init(meta: dict[str, Any], start: str | None) -> None:
    """CUDA is initialised now: record the job's value then, beside the one it started with."""
    meta[META_KEY] = {"start": start or "", "init": os.environ.get(VARIABLE) or ""}


def changed_by_job(meta: Mapping[str, Any]) -> str | None:
    """The value the job set itself before CUDA started ("" where it unset it), else None."""
    values = meta.get(META_KEY)
    if not isinstance(values, dict) or values.get("start") == values.get("init"):
        return None
    return str(values.get("init") or "")


def environ_for(meta: Mapping[str, Any]) -> Mapping[str, str] | None:
    """The environment the estimate's context figures read: this process's with the variable as
    the job had it at CUDA's initialisation (an in-process job's later setting, still in
    `os.environ`, does not count); None where the trace does not say (CUDA never started)."""
    values = meta.get(META_KEY)
    if not isinstance(values, dict):
        return None
    environ = {name: text for name, text in os.environ.items() if name != VARIABLE}
    if values.get("init"):
        environ[VARIABLE] = str(values["init"])
    return environ
