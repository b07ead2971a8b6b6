"""torchvision detection/segmentation models (Mask R-CNN, Faster R-CNN, RetinaNet) on synthetic
images and boxes, built without weights (no pretrained backbone)."""

from __future__ import annotations

import torch
from _common import base_parser, build_on, report, setup, train
from torch import nn

MODELS = ("maskrcnn_resnet50_fpn", "fasterrcnn_resnet50_fpn", "retinanet_resnet50_fpn")


def build(args) -> nn.Module:
    import torchvision

    return torchvision.models.get_model(
        args.model,
        weights=None,
        weights_backbone=None,
        num_classes=args.num_classes,
        min_size=args.image_size,
        max_size=args.image_size,
        trainable_backbone_layers=5,
    )


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--model", choices=MODELS, default="maskrcnn_resnet50_fpn")
    parser.add_argument("--image-size", type=int, default=800)
    parser.add_argument("--num-classes", type=int, default=91)
    parser.add_argument("--boxes", type=int, default=8, help="objects per image")
    args = parser.parse_args()
    if args.grad_checkpointing:
        parser.error("--grad-checkpointing is not supported for the detection models")
    device = setup(args)
    model = build_on(device, lambda: build(args))
    size, n = args.image_size, args.boxes
    generator = torch.Generator().manual_seed(args.seed)

    def make_batch():
        images = [torch.rand(3, size, size, device=device) for _ in range(args.batch_size)]
        targets = []
        for _ in range(args.batch_size):
            xy = torch.rand(n, 2, generator=generator) * size * 0.6
            wh = torch.rand(n, 2, generator=generator) * size * 0.3 + 8
            boxes = torch.cat([xy, xy + wh], dim=1).to(device)
            target = {
                "boxes": boxes,
                "labels": torch.randint(1, args.num_classes, (n,), generator=generator).to(device),
            }
            if args.model.startswith("maskrcnn"):
                masks = torch.zeros(n, size, size, dtype=torch.uint8)
                for i, (x0, y0, x1, y1) in enumerate(boxes.cpu().long().tolist()):
                    masks[i, y0:y1, x0:x1] = 1
                target["masks"] = masks.to(device)
            targets.append(target)
        return images, targets

    def loss_fn(m, batch):
        images, targets = batch
        return sum(m(images, targets).values())

    report(args.model, train(model, make_batch, loss_fn, args))


if __name__ == "__main__":
    main()
