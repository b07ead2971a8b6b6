"""xMem's torchvision CNN training job (Stone-ResearchLife/xMem: `perf_estimator/models.py`
`AllModels`, `perf_estimator/dataset.py` `image_dataset`, `exp/trainer/trainer.py` `ModelPreparer`,
`exp/trainer/train_loop.py` `conv_train_loop`), rebuilt without downloads.

What xMem ran (torch 2.6.0; needs the optional `torchvision` package here):
- the model: an `AllModels` member, built without weights on the host, deep-copied, `.to(device)`,
  `model.train()`. `torchvision.models.<name>(weights=None)` keeps torchvision's 1000 classes
  (VGG11/16/19, ResNet50/101/152, MobileNetV2, ConvNeXt Tiny/Base, the RegNets); xMem's
  MobileNetV3 Small/Large (`MobileNetV3(setting, last_channel=1024|1280, num_classes=10)`, with
  the same block settings as torchvision's builders) and MnasNet (`MNASNet(alpha=1.0,
  num_classes=10)`) have 10. Built on the host as xMem does: torchvision's RegNet computes its
  stage widths and depths with torch ops (`BlockParams.from_init_params`), so a model built under
  `with torch.device("cuda")` would read them back from the device;
- the data: CIFAR-10 train split through `Resize((86, 86))`, `ToTensor()`, `Normalize` (float32,
  3 x 86 x 86), `DataLoader(batch_size=B, shuffle=True)` (no pin_memory; 50000 images, so the
  first steps always get full batches). Here: random images and labels 0..9 on the host, moved
  to the device each step;
- the optimizer: `getattr(torch.optim, name)(params=model.parameters(), lr=1e-3)` with the
  defaults (SGD without momentum; AdamW when none is named); a StepLR scheduler (no device
  memory, left out); `CrossEntropyLoss()`;
- the loop: `zero_grad()` at the chosen point (mode 0: before the batch moves; 1: after the
  forward, before backward, what `ModelTrainer`'s default gave the runs that record no mode:
  `peakmem.baselines.peakmem_estimator.XMEM_CNN_UNRECORDED_ZERO_GRAD_MODE`; 2: after the step), `inputs, labels = .to(device)`,
  `outputs = model(inputs)`, loss, `backward()`, `step()`, then `_, preds = torch.max(outputs, 1)`;
  `outputs`, `loss` and `preds` live on into the next step; it breaks after the step whose index
  reaches `iterations` (3): 4 steps.

Plain PyTorch + torchvision: `python benchmarks/zoo/xmem_cnn.py --model ResNet50 --batch-size 200`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _xmem import run_steps, xmem_main, xmem_parser  # noqa: E402

# xMem's spelling (perf_estimator/models.py AllModels, as its runs record it)
# -> (torchvision model name, number of classes)
MODELS: dict[str, tuple[str, int]] = {
    "VGG11": ("vgg11", 1000),
    "VGG16": ("vgg16", 1000),
    "VGG19": ("vgg19", 1000),
    "ResNet50": ("resnet50", 1000),
    "ResNet101": ("resnet101", 1000),
    "ResNet152": ("resnet152", 1000),
    "MobileNetV2": ("mobilenet_v2", 1000),
    "MobeNetV3Small": ("mobilenet_v3_small", 10),
    "MobeNetV3Large": ("mobilenet_v3_large", 10),
    "MnasNet": ("mnasnet1_0", 10),
    "ConvNeXtTiny": ("convnext_tiny", 1000),
    "ConvNeXtBase": ("convnext_base", 1000),
    "RegNetX400MF": ("regnet_x_400mf", 1000),
    "RegNetX32GF": ("regnet_x_32gf", 1000),
    "RegNetY400MF": ("regnet_y_400mf", 1000),
    "RegNetY32GF": ("regnet_y_32gf", 1000),
}
OPTIMIZERS = ("SGD", "Adam", "RMSprop", "Adagrad", "AdamW")
CIFAR10_CLASSES = 10


def resolve(name: str) -> tuple[str, int]:
    """xMem's spelling (or a torchvision name from MODELS) -> (torchvision name, classes)."""
    if name in MODELS:
        return MODELS[name]
    for torchvision_name, classes in MODELS.values():
        if name == torchvision_name:
            return torchvision_name, classes
    raise SystemExit(f"unknown model {name!r} (known: {', '.join(MODELS)})")


def build_model(name: str) -> torch.nn.Module:
    import torchvision

    torchvision_name, classes = resolve(name)
    return torchvision.models.get_model(torchvision_name, weights=None, num_classes=classes)


def train(args: argparse.Namespace) -> float:
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = build_model(args.model)  # on the host, as xMem's AllModels are
    model.to(device)
    model.train()
    optimizer = getattr(torch.optim, args.optimizer)(params=model.parameters(), lr=args.lr)
    criterion = torch.nn.CrossEntropyLoss()

    def make_batch():
        inputs = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
        return inputs, torch.randint(0, CIFAR10_CLASSES, (args.batch_size,))

    def forward(model, batch):
        inputs, labels = batch
        outputs = model(inputs)
        return criterion(outputs, labels), outputs

    # xMem's loop computes the predictions after each step
    return run_steps(args, model, optimizer, make_batch, forward, lambda out: torch.max(out, 1))


def parser() -> argparse.ArgumentParser:
    p = xmem_parser(
        __doc__.splitlines()[0],
        "xMem's spelling (ResNet50, MobeNetV3Small, ...) or the torchvision name",
        OPTIMIZERS,
    )
    p.add_argument("--image-size", type=int, default=86, help="xMem: CIFAR-10 resized to 86x86")
    return p


if __name__ == "__main__":
    xmem_main(parser, train)
