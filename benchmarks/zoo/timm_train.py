"""A timm image classifier trained on random images (the GPUMemNet `timm` set's job, rebuilt).

GPUMemNet (arXiv 2602.17817) measured 1017 timm models x batch {8, 16, 32, 64, 128} on an A100
40 GB (torch 2.4.1), but did not publish the driver script. Assumed here (timm defaults, and the
job of the paper's other sets, whose launcher is published):
- the model: `timm.create_model(name, pretrained=False)` (timm's default head: the model's
  `num_classes`, 1000 for ImageNet models), fp32, no AMP, no torch.compile, no cudnn flags;
- headless models (`num_classes == 0`: SAM ViTs, DINOv2 backbones, ...) get a 1000-class head
  (`reset_classifier(1000)`), since a classification loss needs one;
- the input: `pretrained_cfg["input_size"]` (`default_cfg` on older timm), i.e. 3 channels at the
  model's default resolution (224 for most, 384 for the `_384` variants, ...); labels drawn from
  the model's `num_classes`; cross-entropy;
- the optimizer: not known. `Adam(lr=1e-3)`, as in the paper's MLP/CNN/Transformer launchers;
- the loop: `_common.train` (zero_grad -> forward + loss -> backward -> step -> loss.item()).

Needs the optional `timm` package: `python benchmarks/zoo/timm_train.py --model resnet50
--batch-size 32`.
"""

from __future__ import annotations

import torch
from _common import base_parser, build_on, report, setup, train
from torch import nn


def input_size(model: nn.Module) -> tuple[int, int, int]:
    """The model's default input size (C, H, W) from its pretrained_cfg / default_cfg."""
    for attr in ("pretrained_cfg", "default_cfg"):
        cfg = getattr(model, attr, None)
        if isinstance(cfg, dict) and cfg.get("input_size"):
            return tuple(int(v) for v in cfg["input_size"])  # type: ignore[return-value]
    return (3, 224, 224)  # timm's own fallback


def num_classes(model: nn.Module) -> int:
    classes = getattr(model, "num_classes", None)
    if not classes:
        cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
        classes = cfg.get("num_classes", 1000)
    return int(classes)


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a timm model name (timm.list_models())")
    parser.add_argument("--image-size", type=int, default=None,
                        help="square input size (default: the model's pretrained_cfg input size)")
    parser.set_defaults(optimizer="adam", lr=1e-3)
    args = parser.parse_args()
    device = setup(args)

    import timm

    def create() -> nn.Module:
        model = timm.create_model(args.model, pretrained=False)
        if getattr(model, "num_classes", None) == 0 and hasattr(model, "reset_classifier"):
            model.reset_classifier(1000)  # headless (feature) models: an ImageNet head assumed
        return model

    model = build_on(device, create)
    channels, height, width = input_size(model)
    if args.image_size is not None:
        height = width = args.image_size
    classes = num_classes(model)

    def make_batch():
        x = torch.randn(args.batch_size, channels, height, width, device=device)
        y = torch.randint(0, classes, (args.batch_size,), device=device)
        return x, y

    def loss_fn(m, batch):
        x, y = batch
        return nn.functional.cross_entropy(m(x), y)

    report(args.model, train(model, make_batch, loss_fn, args))


if __name__ == "__main__":
    main()
