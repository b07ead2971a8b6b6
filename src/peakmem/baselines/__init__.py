"""Baseline peak-memory estimators from the literature, behind one interface (see base.py)."""

from peakmem.baselines.base import (
    ESTIMATORS,
    CannotEstimate,
    Estimate,
    Estimator,
    EstimatorUnavailable,
    get_estimator,
)

__all__ = [
    "ESTIMATORS",
    "CannotEstimate",
    "Estimate",
    "Estimator",
    "EstimatorUnavailable",
    "get_estimator",
]
