"""A UNet (Ronneberger et al. 2015, with BatchNorm and padded convolutions) for semantic
segmentation of synthetic images."""

from __future__ import annotations

import torch
from _common import Checkpointed, base_parser, build_on, report, setup, train
from torch import nn


class DoubleConv(nn.Sequential):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),
        )


class Up(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cin // 2, 2, stride=2)
        self.conv = DoubleConv(cin, cout)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([skip, self.up(x)], dim=1))


class UNet(nn.Module):
    def __init__(self, in_channels: int, num_classes: int, base: int, levels: int) -> None:
        super().__init__()
        widths = [base * 2**i for i in range(levels + 1)]
        self.inc = DoubleConv(in_channels, widths[0])
        self.downs = nn.ModuleList(DoubleConv(widths[i], widths[i + 1]) for i in range(levels))
        self.ups = nn.ModuleList(Up(widths[i + 1], widths[i]) for i in reversed(range(levels)))
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Conv2d(widths[0], num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self.inc(x)]
        for down in self.downs:
            skips.append(down(self.pool(skips[-1])))
        x = skips.pop()
        for up in self.ups:
            x = up(x, skips.pop())
        return self.head(x)


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--image-size", type=int, default=256, help="divisible by 2**levels")
    parser.add_argument("--in-channels", type=int, default=3)
    parser.add_argument("--num-classes", type=int, default=21)
    parser.add_argument("--base-channels", type=int, default=64)
    parser.add_argument("--levels", type=int, default=4)
    parser.add_argument("--channels-last", action="store_true")
    args = parser.parse_args()
    if args.image_size % 2**args.levels:
        parser.error(f"--image-size must be divisible by {2**args.levels}")
    device = setup(args)
    model = build_on(
        device, lambda: UNet(args.in_channels, args.num_classes, args.base_channels, args.levels)
    )
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    if args.grad_checkpointing:
        model.downs = nn.ModuleList(Checkpointed(m) for m in model.downs)
        for up in model.ups:
            up.conv = Checkpointed(up.conv)
    size = args.image_size

    def make_batch():
        x = torch.randn(args.batch_size, args.in_channels, size, size, device=device)
        y = torch.randint(0, args.num_classes, (args.batch_size, size, size), device=device)
        return x.contiguous(memory_format=memory_format), y

    def loss_fn(m, batch):
        x, y = batch
        return nn.functional.cross_entropy(m(x), y)

    report("unet", train(model, make_batch, loss_fn, args))


if __name__ == "__main__":
    main()
