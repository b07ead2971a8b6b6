"""keras.io's "Simple MNIST convnet" (keras-team/keras-io examples/vision/mnist_convnet.py) on
Keras 3 with the PyTorch backend (`KERAS_BACKEND=torch`, set before `import keras` as the Keras
docs show): a Sequential of Conv2D / MaxPooling2D / Flatten / Dropout / Dense(softmax),
`model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])`,
`model.fit(..., validation_split=0.1)` and `model.evaluate`. Keras puts its variables on "cuda"
when `torch.cuda.is_available()`. `keras.datasets.mnist.load_data()` downloads (and checks the
file's hash): `--samples` seeded uint8 images and labels of MNIST's shapes stand in for it.

To run: KERAS_BACKEND=torch python mnist_convnet.py --epochs 15
"""
import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=15)
parser.add_argument("--batch-size", type=int, default=128)
parser.add_argument("--samples", type=int, default=60000)
args = parser.parse_args()

"""
## Prepare the data
"""

# Model / data parameters
num_classes = 10
input_shape = (28, 28, 1)

# Load the data and split it between train and test sets
rng = np.random.default_rng(0)
x_train = rng.integers(0, 256, (args.samples, 28, 28), dtype=np.uint8)
y_train = rng.integers(0, num_classes, (args.samples,), dtype=np.uint8)
x_test = rng.integers(0, 256, (args.samples // 6, 28, 28), dtype=np.uint8)
y_test = rng.integers(0, num_classes, (args.samples // 6,), dtype=np.uint8)

# Scale images to the [0, 1] range
x_train = x_train.astype("float32") / 255
x_test = x_test.astype("float32") / 255
# Make sure images have shape (28, 28, 1)
x_train = np.expand_dims(x_train, -1)
x_test = np.expand_dims(x_test, -1)
print("x_train shape:", x_train.shape)
print(x_train.shape[0], "train samples")
print(x_test.shape[0], "test samples")


# convert class vectors to binary class matrices
y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)

"""
## Build the model
"""

model = keras.Sequential(
    [
        keras.Input(shape=input_shape),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(num_classes, activation="softmax"),
    ]
)

model.summary()

"""
## Train the model
"""

batch_size = args.batch_size
epochs = args.epochs

model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])

model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.1)

"""
## Evaluate the trained model
"""

score = model.evaluate(x_test, y_test, verbose=0)
print("Test loss:", score[0])
print("Test accuracy:", score[1])
