"""A plain MLP classifier on synthetic features."""

from __future__ import annotations

import torch
from _common import base_parser, build_on, checkpoint_children, report, setup, train
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "tanh": nn.Tanh}


def build(args) -> nn.Module:
    layers: list[nn.Module] = []
    width = args.input_size
    for _ in range(args.depth):
        block = [nn.Linear(width, args.hidden_size), ACTIVATIONS[args.activation]()]
        if args.dropout > 0:
            block.append(nn.Dropout(args.dropout))
        layers.append(nn.Sequential(*block))
        width = args.hidden_size
    layers.append(nn.Linear(width, args.num_classes))
    return nn.Sequential(*layers)


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--input-size", type=int, default=1024)
    parser.add_argument("--hidden-size", type=int, default=4096)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--activation", choices=sorted(ACTIVATIONS), default="relu")
    parser.add_argument("--dropout", type=float, default=0.0)
    args = parser.parse_args()
    device = setup(args)
    model = build_on(device, lambda: build(args))
    if args.grad_checkpointing:
        checkpoint_children(model, [str(i) for i in range(args.depth)])

    def make_batch():
        x = torch.randn(args.batch_size, args.input_size, device=device)
        y = torch.randint(0, args.num_classes, (args.batch_size,), device=device)
        return x, y

    def loss_fn(m, batch):
        x, y = batch
        return nn.functional.cross_entropy(m(x), y)

    report("mlp", train(model, make_batch, loss_fn, args))


if __name__ == "__main__":
    main()
