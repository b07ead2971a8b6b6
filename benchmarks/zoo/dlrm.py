"""A DLRM-style recommendation model (Naumov et al. 2019): a bottom MLP over dense features,
EmbeddingBag tables over sparse features, pairwise dot interactions, a top MLP; click labels."""

from __future__ import annotations

import torch
from _common import base_parser, build_on, report, setup, train
from torch import nn


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(
        self, dense: int, tables: int, rows: int, dim: int, bottom: list[int], top: list[int]
    ) -> None:
        super().__init__()
        self.bottom = mlp([dense, *bottom, dim])
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        features = tables + 1
        pairs = features * (features - 1) // 2
        self.top = mlp([dim + pairs, *top, 1])
        self.register_buffer("_rows", torch.triu_indices(features, features, 1)[0], False)
        self.register_buffer("_cols", torch.triu_indices(features, features, 1)[1], False)

    def forward(self, dense: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor):
        x = self.bottom(dense)
        embedded = [table(indices[i], offsets) for i, table in enumerate(self.tables)]
        features = torch.stack([x, *embedded], dim=1)  # (B, F, D)
        dots = torch.bmm(features, features.transpose(1, 2))[:, self._rows, self._cols]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--dense-features", type=int, default=13)
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--rows", type=int, default=100_000, help="rows per embedding table")
    parser.add_argument("--embedding-dim", type=int, default=128)
    parser.add_argument("--pooling", type=int, default=4, help="indices per bag")
    parser.add_argument("--bottom", default="512,256", help="bottom MLP widths")
    parser.add_argument("--top", default="1024,1024,512,256", help="top MLP widths")
    args = parser.parse_args()
    device = setup(args)
    widths = [[int(w) for w in spec.split(",") if w] for spec in (args.bottom, args.top)]
    model = build_on(
        device,
        lambda: DLRM(args.dense_features, args.tables, args.rows, args.embedding_dim, *widths),
    )
    if args.grad_checkpointing:
        parser.error("--grad-checkpointing is not supported for dlrm")
    b = args.batch_size

    def make_batch():
        dense = torch.randn(b, args.dense_features, device=device)
        indices = torch.randint(0, args.rows, (args.tables, b * args.pooling), device=device)
        offsets = torch.arange(0, b * args.pooling, args.pooling, device=device)
        clicks = torch.randint(0, 2, (b,), device=device).float()
        return dense, indices, offsets, clicks

    def loss_fn(m, batch):
        dense, indices, offsets, clicks = batch
        return nn.functional.binary_cross_entropy_with_logits(m(dense, indices, offsets), clicks)

    report("dlrm", train(model, make_batch, loss_fn, args))


if __name__ == "__main__":
    main()
