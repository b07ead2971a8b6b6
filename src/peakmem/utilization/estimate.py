"""The utilization part of an estimate: the model run on a capture's steady-state step."""

from __future__ import annotations

from typing import Any

from peakmem.utilization.kernel_families import META_KEY
from peakmem.utilization.model import StepFormatError, StepOps, Utilization, utilization

MAX_WORKERS = 1024


def loader_settings(meta: dict[str, Any]) -> tuple[int, bool]:
    """(DataLoader workers, pinned memory) the capture saw the job ask for."""
    workers = meta.get("loader_workers", 0)
    if type(workers) is not int or not 0 <= workers <= MAX_WORKERS:
        workers = 0
    return workers, meta.get("loader_pin_memory") is True


def utilization_of(
    capture: Any,
    gpu: Any,
    notes: list[str] | None = None,
    *,
    loader: tuple[int, bool] | None = None,
    assumptions: list[str] | None = None,
) -> Utilization | None:
    """The predicted utilization of the capture's job on `gpu`; None (with a note) when the job
    trained no step or the GPU profile has no throughput figures."""
    meta = getattr(capture.trace, "meta", {}) or {}
    record = meta.get(META_KEY)
    if record is None or not getattr(capture, "trained", False):
        return None
    if not gpu.throughput:
        if notes is not None:
            notes.append(f"utilization: no throughput figures for {gpu.name}: not predicted")
        return None
    try:
        ops = StepOps.from_meta(record)
    except StepFormatError as exc:
        if notes is not None:
            notes.append(f"utilization: not predicted ({exc})")
        return None
    workers, pinned = loader if loader is not None else loader_settings(meta)
    result = utilization(ops, gpu, loader_workers=workers, pinned=pinned)
    if assumptions is not None:
        assumptions.append(
            "utilization: a timing model of one steady-state iteration (docs/utilization.md): "
            "the job alone on the GPU; jobs sharing a GPU do not add up"
        )
    if notes is not None and not ops.steady:
        notes.append("utilization: only the first training step was seen (not a steady state)")
    return result
