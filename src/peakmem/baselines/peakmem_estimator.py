"""peakmem's own estimate as a bench row: arrives with `peakmem estimate` (another branch).

Until then asking for it fails with one clear line, and the other estimators are unaffected.
"""

from __future__ import annotations

from peakmem.baselines.base import Estimator, EstimatorUnavailable


class PeakmemEstimator(Estimator):
    name = "peakmem"

    def __init__(self) -> None:
        raise EstimatorUnavailable(
            "estimator 'peakmem' is not available yet (it arrives with `peakmem estimate`)"
        )
