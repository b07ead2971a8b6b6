"""GPUMemNet's utilization classifier (arXiv 2602.17817), re-implemented as a baseline.

The paper estimates each DCGM utilization metric as one of three coarse bins from the same
per-row features its memory classifier reads (peakmem.baselines.gpumemnet: depth, batch size,
parameters, activations, layer counts, the activation's encoding), with k-fold cross-validation.
Here: one scikit-learn MLPClassifier per metric (as the memory baseline), stratified 3-fold,
every row predicted by the fold model that did not see it. The bins are thirds of [0, 1]
(UTILIZATION_BINS): low < 1/3 <= medium < 2/3 <= high.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from peakmem.baselines.base import CannotEstimate
from peakmem.baselines.gpumemnet import FAMILIES, FOLDS, SEED, _fold_split, make_classifier
from peakmem.datasets.rows import BenchRow

UTILIZATION_BINS = (1 / 3, 2 / 3)
BIN_NAMES = ("low", "medium", "high")
BIN_CENTERS = (1 / 6, 1 / 2, 5 / 6)


def utilization_bin(value: float) -> int:
    """0 (low), 1 (medium) or 2 (high)."""
    return int(np.searchsorted(UTILIZATION_BINS, value, side="right"))


@dataclass
class UtilizationCV:
    """Out-of-fold bin predictions of every usable row, by row id."""

    predicted: dict[str, int]
    accuracy_per_fold: list[float]


def cross_validate_metric(
    rows: list[BenchRow], targets: dict[str, float], dataset: str, folds: int = FOLDS,
    seed: int = SEED,
) -> UtilizationCV:
    """k-fold over `rows` (those with a target and the family's features) for one metric."""
    spec = FAMILIES[dataset]
    usable, x = [], []
    for row in rows:
        if row.id not in targets:
            continue
        try:
            x.append(spec.features(row))
        except CannotEstimate:
            continue
        usable.append(row)
    if len(usable) < folds:
        raise CannotEstimate(f"too few rows ({len(usable)}) for {folds}-fold cross-validation")
    features = np.array(x, dtype=float)
    labels = np.array([utilization_bin(targets[r.id]) for r in usable], dtype=int)
    predicted = np.zeros_like(labels)
    accuracies = []
    for train, test in _fold_split(labels, folds, seed):
        if len(set(labels[train].tolist())) == 1:  # one class only: predict it
            predicted[test] = labels[train][0]
        else:
            model = make_classifier(seed)
            model.fit(features[train], labels[train])
            predicted[test] = model.predict(features[test])
        accuracies.append(float(np.mean(predicted[test] == labels[test])))
    return UtilizationCV({r.id: int(p) for r, p in zip(usable, predicted, strict=True)}, accuracies)
