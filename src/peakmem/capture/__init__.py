"""Run a training job on the CPU with a fake CUDA device and record its device memory trace."""

from peakmem.capture.phases import StopJob
from peakmem.capture.runner import (
    DEFAULT_STEPS,
    CaptureResult,
    capture_callable,
    capture_command,
)
from peakmem.capture.unsupported import Unsupported

__all__ = [
    "DEFAULT_STEPS",
    "CaptureResult",
    "StopJob",
    "Unsupported",
    "capture_callable",
    "capture_command",
]
