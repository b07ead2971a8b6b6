"""GPUMemNet (arXiv 2602.17817, GitHub itu-rad/GPUMemNet): an MLP classifier over memory bins.

Re-implemented from the paper's public data loaders (Ensemble/dataloaders/dataloaders4mlp.py):
- features per family, taken from the dataset's own columns:
  MLP: Depth, Batch Size, Total Parameters, Total Activations, BatchNorm layers, Dropout layers,
  and the activation as a (sin, cos) positional encoding over the sorted activation names;
  CNN: Depth, Total Activations, Total Activations x Batch, Total Parameters, Batch Size,
  Conv2d / BatchNorm2d / Dropout counts, activation (sin, cos);
  Transformer: Depth, Total Activations, Total Activations x Batch, Total Parameters, Batch Size,
  NonDynamicallyQuantizableLinear / Linear / LayerNorm / Dropout counts;
- bins: 1000 MiB on the MLP sets (label k = (1000k, 1000(k+1)] MiB), 8000 MiB on CNN and
  Transformer sets (label k = [8000k, 8000(k+1)) MiB, OOM rows placed at 42000 MiB as the
  paper does);
- stratified 3-fold cross-validation. The paper trains an ensemble of small MLPs with PyTorch
  Lightning; this uses one scikit-learn MLPClassifier (2 x 32 ReLU units, Adam, standardised
  inputs), which reaches the paper's MLP-set accuracy (tests/baselines/test_gpumemnet.py).

As a bench estimator every row is predicted by the fold model that did not see it (out-of-fold),
and the estimate is the predicted bin's upper edge: the memory a scheduler would reserve.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from peakmem.baselines.base import CannotEstimate, Estimator, EstimatorUnavailable
from peakmem.datasets.gpumemnet_jobs import ACTIVATIONS
from peakmem.datasets.rows import BenchRow, MiB

MLP_ACTIVATIONS = (
    "ELU",
    "GELU",
    "Identity",
    "LeakyReLU",
    "Mish",
    "PReLU",
    "ReLU",
    "SELU",
    "SiLU",
    "Softplus",
    "Tanh",
)
CNN_ACTIVATIONS = tuple(name for name in MLP_ACTIVATIONS if name != "Identity")
OOM_PLACEHOLDER_MIB = 42000.0
FOLDS = 3
SEED = 0


def _encode(activation: str, names: tuple[str, ...]) -> list[float]:
    if activation not in names:
        raise CannotEstimate(f"activation {activation!r} not in GPUMemNet's encoding")
    i = names.index(activation)
    return [math.sin(i * math.pi / len(names)), math.cos(i * math.pi / len(names))]


def _num(features: dict[str, str], key: str, default: float | None = None) -> float:
    value = features.get(key, "")
    if value == "":
        if default is None:
            raise CannotEstimate(f"row lacks GPUMemNet feature {key!r}")
        return default
    return float(value)


def _activation(row: BenchRow) -> str:
    """The activation class name, from the parsed launcher configuration (the CSV column is
    blank or 'None' on some CNN rows)."""
    name = getattr(row.job, "activation", None)
    return ACTIVATIONS[name] if name else row.features.get("Activation Function") or "ReLU"


def mlp_features(row: BenchRow) -> list[float]:
    f = row.features
    return [
        _num(f, "Depth"),
        _num(f, "Batch Size"),
        _num(f, "Total Parameters"),
        _num(f, "Total Activations"),
        _num(f, "Batch Normalization Layers", 0.0),
        _num(f, "Dropout Layers", 0.0),
        *_encode(_activation(row), MLP_ACTIVATIONS),
    ]


def cnn_features(row: BenchRow) -> list[float]:
    f = row.features
    return [
        _num(f, "Depth"),
        _num(f, "Total Activations"),
        _num(f, "Total Activations") * _num(f, "Batch Size"),
        _num(f, "Total Parameters"),
        _num(f, "Batch Size"),
        _num(f, "Conv2d Count"),
        _num(f, "BatchNorm2d Count"),
        _num(f, "Dropout Count"),
        *_encode(_activation(row), CNN_ACTIVATIONS),
    ]


def transformer_features(row: BenchRow) -> list[float]:
    f = row.features
    return [
        _num(f, "Depth"),
        _num(f, "Total Activations"),
        _num(f, "Total Activations") * _num(f, "Batch Size"),
        _num(f, "Total Parameters"),
        _num(f, "Batch Size"),
        _num(f, "NonDynamicallyQuantizableLinear Count"),
        _num(f, "Linear Count"),
        _num(f, "LayerNorm Count"),
        _num(f, "Dropout Count"),
    ]


@dataclass(frozen=True)
class BinScheme:
    width_mib: float
    right_closed: bool  # (a, b] bins (the MLP loader) vs [a, b) (CNN / Transformer loaders)

    def label(self, mib: float) -> int:
        if self.right_closed:
            return max(math.ceil(mib / self.width_mib) - 1, 0)
        return int(mib // self.width_mib)

    def upper_edge_bytes(self, label: int) -> int:
        return int((label + 1) * self.width_mib * MiB)


@dataclass(frozen=True)
class FamilySpec:
    features: Callable[[BenchRow], list[float]]
    bins: BinScheme


FAMILIES: dict[str, FamilySpec] = {
    "gpumemnet-mlp1": FamilySpec(mlp_features, BinScheme(1000, right_closed=True)),
    "gpumemnet-mlp2": FamilySpec(mlp_features, BinScheme(1000, right_closed=True)),
    "gpumemnet-cnn": FamilySpec(cnn_features, BinScheme(8000, right_closed=False)),
    "gpumemnet-transformer": FamilySpec(transformer_features, BinScheme(8000, right_closed=False)),
    "gpumemnet-transformer17": FamilySpec(transformer_features, BinScheme(8000, right_closed=False)),
}


def target_mib(row: BenchRow) -> float:
    return OOM_PLACEHOLDER_MIB if row.status == "oom" else row.measured_mib


def make_classifier(seed: int = SEED):  # type: ignore[no-untyped-def]
    try:
        from sklearn.neural_network import MLPClassifier
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
    except ImportError as exc:
        raise EstimatorUnavailable(
            "estimator 'gpumemnet' needs scikit-learn (extra `bench`)"
        ) from exc
    return make_pipeline(
        StandardScaler(), MLPClassifier((32, 32), max_iter=2000, random_state=seed)
    )


def _fold_split(labels: np.ndarray, folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import KFold, StratifiedKFold

    smallest = np.bincount(labels).max(initial=0) if labels.size else 0
    counts = np.bincount(labels)
    if labels.size >= folds and counts[counts > 0].min(initial=smallest) >= folds:
        splitter = StratifiedKFold(folds, shuffle=True, random_state=seed)
        return list(splitter.split(np.zeros(len(labels)), labels))
    # too few rows in some bin to stratify (e.g. the 17-row Transformer sample): plain k-fold
    splitter = KFold(min(folds, len(labels)), shuffle=True, random_state=seed)
    return list(splitter.split(np.zeros(len(labels))))


@dataclass
class CrossValidation:
    accuracy_per_fold: list[float]
    labels: np.ndarray
    predicted: np.ndarray  # out-of-fold prediction of every row

    @property
    def accuracy(self) -> float:
        return float(np.mean(self.accuracy_per_fold))


def cross_validate(
    rows: list[BenchRow], dataset: str, folds: int = FOLDS, seed: int = SEED
) -> tuple[CrossValidation, list]:
    """Stratified k-fold: per-fold accuracy, out-of-fold predictions, and the fold models."""
    spec = FAMILIES[dataset]
    x = np.array([spec.features(r) for r in rows], dtype=float)
    y = np.array([spec.bins.label(target_mib(r)) for r in rows], dtype=int)
    predicted = np.zeros_like(y)
    accuracies: list[float] = []
    models = []
    for train, test in _fold_split(y, folds, seed):
        model = make_classifier(seed)
        model.fit(x[train], y[train])
        predicted[test] = model.predict(x[test])
        accuracies.append(float(np.mean(predicted[test] == y[test])))
        models.append((set(test.tolist()), model))
    return CrossValidation(accuracies, y, predicted), models


class GpuMemNetEstimator(Estimator):
    name = "gpumemnet"

    def __init__(self) -> None:
        make_classifier()  # fail early (EstimatorUnavailable) without scikit-learn
        self._dataset: str | None = None
        self._fold_of: dict[str, object] = {}
        self.cv: CrossValidation | None = None

    def prepare(self, rows: list[BenchRow]) -> None:
        datasets = {r.dataset for r in rows}
        if len(datasets) != 1 or next(iter(datasets)) not in FAMILIES:
            self._dataset = None  # rows of another kind: estimate() says why
            return
        self._dataset = next(iter(datasets))
        usable = []
        for row in rows:
            try:
                FAMILIES[self._dataset].features(row)
                usable.append(row)
            except CannotEstimate:
                continue
        self.cv, models = cross_validate(usable, self._dataset)
        for index, row in enumerate(usable):
            self._fold_of[row.id] = next(m for test, m in models if index in test)

    def estimate_bytes(self, row: BenchRow) -> int:
        if row.dataset not in FAMILIES:
            raise CannotEstimate(f"GPUMemNet has no feature set for {row.dataset} rows")
        model = self._fold_of.get(row.id) if self._dataset == row.dataset else None
        if model is None:
            raise CannotEstimate("GPUMemNet was not cross-validated on this row's dataset")
        spec = FAMILIES[row.dataset]
        x = np.array([spec.features(row)], dtype=float)
        label = int(model.predict(x)[0])  # type: ignore[attr-defined]
        return spec.bins.upper_edge_bytes(label)
