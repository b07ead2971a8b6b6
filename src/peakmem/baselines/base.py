"""The one interface every baseline estimator implements, and the name -> estimator registry."""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass

from peakmem.datasets.rows import BenchRow


class CannotEstimate(Exception):
    """This estimator cannot estimate this row (one-line reason)."""


class MissingPackage(CannotEstimate):
    """The row needs an optional package this machine lacks: not a fact about the row, so the
    bench does not cache it (the same row may run once the package is installed)."""


class EstimatorUnavailable(RuntimeError):
    """The estimator exists by name but cannot run here (missing implementation or extra)."""


@dataclass(frozen=True)
class Estimate:
    peak_bytes: int
    seconds: float
    stated_margin: float | None = None
    """The margin the estimator itself states for this estimate (peakmem: calibrated per kind
    of job), if any."""


class Estimator:
    """Subclasses implement `estimate_bytes`; `prepare` may fit on the whole dataset first
    (called once in the parent process; the estimator is then pickled to worker processes)."""

    name: str = ""
    version: str = ""
    """Part of the bench cache key: change it when the estimator's results change."""

    def prepare(self, rows: list[BenchRow]) -> None:  # noqa: B027 - optional hook
        """Fit on the dataset's rows before any estimate (default: nothing to fit)."""

    def estimate_bytes(self, row: BenchRow) -> int:
        raise NotImplementedError

    def estimate(self, row: BenchRow) -> Estimate:
        start = time.perf_counter()
        peak = self.estimate_bytes(row)
        return Estimate(int(peak), time.perf_counter() - start)


# estimator name -> "module:class"; modules are imported only when the estimator is asked for
ESTIMATORS: dict[str, str] = {
    "peakmem": "peakmem.baselines.peakmem_estimator:PeakmemEstimator",
    "horus": "peakmem.baselines.horus:HorusEstimator",
    "faketensor": "peakmem.baselines.faketensor:FakeTensorEstimator",
    "gpumemnet": "peakmem.baselines.gpumemnet:GpuMemNetEstimator",
    "accelerate": "peakmem.baselines.accelerate:AccelerateEstimator",
    "deepspeed": "peakmem.baselines.deepspeed:DeepSpeedEstimator",
}


def get_estimator(name: str) -> Estimator:
    """A fresh estimator; KeyError (unknown name) / EstimatorUnavailable carry a one-line message."""
    target = ESTIMATORS.get(name)
    if target is None:
        raise KeyError(f"unknown estimator {name!r}; known: {', '.join(ESTIMATORS)}")
    module_name, attr = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EstimatorUnavailable(f"estimator {name!r} needs {exc.name}: install it") from exc
    return getattr(module, attr)()
