"""torchvision image classifiers (CNNs, ViT, Swin) on synthetic images, built without weights."""

from __future__ import annotations

from collections import OrderedDict

import torch
from _common import (
    Checkpointed,
    base_parser,
    build_on,
    checkpoint_children,
    report,
    setup,
    train,
)
from torch import nn

# model name -> (default image size, containers whose children are checkpointed)
MODELS: dict[str, tuple[int, tuple[str, ...]]] = {
    "resnet18": (224, ("layer1", "layer2", "layer3", "layer4")),
    "resnet50": (224, ("layer1", "layer2", "layer3", "layer4")),
    "resnet101": (224, ("layer1", "layer2", "layer3", "layer4")),
    "resnet152": (224, ("layer1", "layer2", "layer3", "layer4")),
    "wide_resnet50_2": (224, ("layer1", "layer2", "layer3", "layer4")),
    "resnext50_32x4d": (224, ("layer1", "layer2", "layer3", "layer4")),
    "vgg16": (224, ("features",)),
    "vgg19_bn": (224, ("features",)),
    "alexnet": (224, ("features",)),
    "mobilenet_v2": (224, ("features",)),
    "mobilenet_v3_small": (224, ("features",)),
    "mobilenet_v3_large": (224, ("features",)),
    "efficientnet_b0": (224, ("features",)),
    "efficientnet_b3": (300, ("features",)),
    "convnext_tiny": (224, ("features",)),
    "convnext_small": (224, ("features",)),
    "densenet121": (224, ("features",)),
    "densenet169": (224, ("features",)),
    "inception_v3": (299, ()),  # its Mixed_* blocks are checkpointed by name
    "googlenet": (224, ()),
    "regnet_y_400mf": (224, ("trunk_output",)),
    "regnet_y_1_6gf": (224, ("trunk_output",)),
    "regnet_x_3_2gf": (224, ("trunk_output",)),
    "shufflenet_v2_x1_0": (224, ("stage2", "stage3", "stage4")),
    "squeezenet1_1": (224, ("features",)),
    "mnasnet1_0": (224, ("layers",)),
    "vit_b_16": (224, ("encoder.layers",)),
    "vit_b_32": (224, ("encoder.layers",)),
    "vit_l_16": (224, ("encoder.layers",)),
    "swin_t": (224, ("features",)),
    "swin_s": (224, ("features",)),
    "swin_v2_t": (256, ("features",)),
    "maxvit_t": (224, ("blocks",)),
}


def build(args) -> nn.Module:
    import torchvision

    kwargs = {"weights": None, "num_classes": args.num_classes}
    if args.model == "inception_v3" or args.model == "googlenet":
        kwargs.update(aux_logits=not args.no_aux_logits, init_weights=False)
    if args.model.startswith("vit_"):
        kwargs["image_size"] = args.image_size
    return torchvision.models.get_model(args.model, **kwargs)


def _is_leaf(module: nn.Module) -> bool:
    return next(module.children(), None) is None


def checkpoint_segments(container: nn.Sequential) -> None:
    """A container of single layers (vgg/alexnet `features`): checkpoint the runs of layers that
    end at each pooling layer, so that no in-place op meets a checkpoint's output."""
    segments: list[list[nn.Module]] = [[]]
    for layer in container:
        segments[-1].append(layer)
        if isinstance(layer, nn.MaxPool2d | nn.AvgPool2d | nn.AdaptiveAvgPool2d):
            segments.append([])
    container._modules = OrderedDict(
        (str(i), Checkpointed(nn.Sequential(*seg))) for i, seg in enumerate(segments) if seg
    )


def apply_checkpointing(model: nn.Module, name: str) -> None:
    """Checkpoint the blocks (children with children) of the model's block containers; single
    layers stay as they are (an in-place ReLU after a checkpointed layer would break)."""
    for path in MODELS[name][1]:
        container = model.get_submodule(path)
        if all(_is_leaf(child) for child in container.children()):
            checkpoint_segments(container)
        else:
            names = [n for n, child in container.named_children() if not _is_leaf(child)]
            checkpoint_children(container, names)
    if name in ("inception_v3", "googlenet"):
        names = [n for n, _ in model.named_children() if n.startswith(("Mixed", "inception"))]
        checkpoint_children(model, names)
    if not any(isinstance(m, Checkpointed) for m in model.modules()):
        raise SystemExit(f"--grad-checkpointing: no blocks to checkpoint in {name}")


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet50")
    parser.add_argument("--image-size", type=int, default=None, help="default: the model's")
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--no-aux-logits", action="store_true", help="inception/googlenet")
    args = parser.parse_args()
    args.image_size = args.image_size or MODELS[args.model][0]
    device = setup(args)
    model = build_on(device, lambda: build(args))
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    if args.grad_checkpointing:
        apply_checkpointing(model, args.model)

    def make_batch():
        x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
        y = torch.randint(0, args.num_classes, (args.batch_size,), device=device)
        return x.contiguous(memory_format=memory_format), y

    def loss_fn(m, batch):
        x, y = batch
        out = m(x)
        if isinstance(out, tuple) and hasattr(out, "logits"):  # inception/googlenet aux heads
            aux = [a for a in out[1:] if a is not None]
            return nn.functional.cross_entropy(out.logits, y) + 0.3 * sum(
                nn.functional.cross_entropy(a, y) for a in aux
            )
        return nn.functional.cross_entropy(out, y)

    report(args.model, train(model, make_batch, loss_fn, args))


if __name__ == "__main__":
    main()
