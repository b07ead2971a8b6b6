"""Keras 3 optimizers on the PyTorch backend: their slot variables are optimizer state
(capture/keras_optimizers.py)."""

import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")

from peakmem.estimate import estimate  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "torch",
                                reason="keras was imported with another backend")


def rounded(nbytes: int) -> int:
    return max(512, -(-nbytes // 512) * 512)


def fit(optimizer: str) -> None:
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
def test_keras_fit_slot_variables_are_optimizer_state(optimizer, slots):
    weights = sum(rounded(n * 4) for n in (32 * 64, 64, 64 * 4, 4))
    result = estimate(fit, optimizer, gpu="a100-40gb", torch_version="2.4.1", mode="fake")
    assert result.steps >= 3
    by_category = result.breakdown.by_category
    assert by_category["parameter"] == weights
    # one slot per trainable variable and moment, the `iterations` counter and the learning
    # rate (0-d variables, a block each)
    assert by_category.get("optimizer_state", 0) == slots * weights + 2 * 512
