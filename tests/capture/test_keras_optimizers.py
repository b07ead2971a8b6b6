"""Keras 3 optimizers on the PyTorch backend: their slot variables are optimizer state
(capture/keras_optimizers.py)."""

import importlib.util
import os
from types import ModuleType

import numpy as np
import pytest

from peakmem.estimate import estimate

pytestmark = pytest.mark.skipif(importlib.util.find_spec("keras") is None,
                                reason="could not import 'keras'")


@pytest.fixture(scope="module")
def keras() -> ModuleType:
    """keras, imported by the first test that needs it rather than at collection: importing it
    (~500 modules, ~5 s of CPU) in every pytest-xdist worker cost each worker that time, and
    the worker's later captures the scans of those modules (docs/DEVELOPMENT.md, suite time).
    A module fixture: the tests run on one worker together (tests/parallel.py)."""
    os.environ.setdefault("KERAS_BACKEND", "torch")
    import keras

    if keras.backend.backend() != "torch":
        pytest.skip("keras was imported with another backend")
    return keras


def rounded(nbytes: int) -> int:
    return max(512, -(-nbytes // 512) * 512)


def fit(keras: ModuleType, optimizer: str) -> None:
    # keras picked its default device when it was imported, outside the capture: the scope
    # puts this model on the (fake) GPU, as the default is on a machine with one
    with keras.device("cuda:0"):
        model = keras.Sequential([keras.Input(shape=(32,)),
                                  keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)])
        model.compile(loss="mse", optimizer=optimizer)
        x = np.zeros((64, 32), dtype="float32")
        y = np.zeros((64, 4), dtype="float32")
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)


@pytest.mark.parametrize(("optimizer", "slots"), [("adam", 2), ("rmsprop", 1)])
def test_keras_fit_slot_variables_are_optimizer_state(keras, optimizer, slots):
    weights = sum(rounded(n * 4) for n in (32 * 64, 64, 64 * 4, 4))
    result = estimate(fit, keras, optimizer, gpu="a100-40gb", torch_version="2.4.1", mode="fake")
    assert result.steps >= 3
    by_category = result.breakdown.by_category
    assert by_category["parameter"] == weights
    # one slot per trainable variable and moment, the `iterations` counter and the learning
    # rate (0-d variables, a block each)
    assert by_category.get("optimizer_state", 0) == slots * weights + 2 * 512
