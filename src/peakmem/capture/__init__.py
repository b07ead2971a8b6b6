"""Run a training job on the CPU with a fake CUDA device and record its device memory trace."""

from peakmem.capture.phases import StopJob
from peakmem.capture.runner import (
    DEFAULT_STEPS,
    CaptureResult,
    CommandError,
    PythonCommand,
    capture_callable,
    capture_command,
)

__all__ = [
    "DEFAULT_STEPS",
    "CaptureResult",
    "CommandError",
    "PythonCommand",
    "StopJob",
    "capture_callable",
    "capture_command",
]
