"""Run a training job on the CPU with a fake CUDA device and record its device memory trace.

The capture machinery (and torch) is imported on first use, so that peakmem's own process can
supervise a job and read its result without importing torch."""

from typing import Any

from peakmem.capture.result import DEFAULT_STEPS, CaptureResult

_LAZY = {
    "StopJob": "peakmem.capture.phases",
    "capture_callable": "peakmem.capture.runner",
    "capture_command": "peakmem.capture.runner",
    "Unsupported": "peakmem.capture.unsupported",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'peakmem.capture' has no attribute {name!r}")


__all__ = [
    "DEFAULT_STEPS",
    "CaptureResult",
    "StopJob",
    "Unsupported",
    "capture_callable",
    "capture_command",
]
