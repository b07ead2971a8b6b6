# ruff: noqa
"""facebookresearch/simsiam `simsiam/builder.py` (main) re-created: a torchvision encoder whose
`fc` becomes a 3-layer BN projector (the original fc kept as its last Linear, its bias frozen
with `requires_grad = False` since a BatchNorm follows), and a 2-layer predictor; the targets
are the detached projections."""

import torch
import torch.nn as nn


class SimSiam(nn.Module):
    """The SimSiam model."""

    def __init__(self, base_encoder, dim=2048, pred_dim=512):
        """dim: feature dimension; pred_dim: the predictor's hidden dimension."""
        super(SimSiam, self).__init__()

        # the encoder: its fc outputs `dim` features; the last BNs zero-initialized
        self.encoder = base_encoder(num_classes=dim, zero_init_residual=True)

        # the 3-layer projector
        prev_dim = self.encoder.fc.weight.shape[1]
        self.encoder.fc.bias.requires_grad = False  # a BN follows: the bias is unused
        self.encoder.fc = nn.Sequential(nn.Linear(prev_dim, prev_dim, bias=False),
                                        nn.BatchNorm1d(prev_dim),
                                        nn.ReLU(inplace=True),  # first layer
                                        nn.Linear(prev_dim, prev_dim, bias=False),
                                        nn.BatchNorm1d(prev_dim),
                                        nn.ReLU(inplace=True),  # second layer
                                        self.encoder.fc,
                                        nn.BatchNorm1d(dim, affine=False))  # output layer

        # the 2-layer predictor
        self.predictor = nn.Sequential(nn.Linear(dim, pred_dim, bias=False),
                                       nn.BatchNorm1d(pred_dim),
                                       nn.ReLU(inplace=True),  # hidden layer
                                       nn.Linear(pred_dim, dim))  # output layer

    def forward(self, x1, x2):
        """x1, x2: the two views. Returns the predictions p1, p2 and the (detached) targets
        z1, z2 (section 3 of https://arxiv.org/abs/2011.10566)."""
        z1 = self.encoder(x1)  # NxC
        z2 = self.encoder(x2)  # NxC

        p1 = self.predictor(z1)  # NxC
        p2 = self.predictor(z2)  # NxC

        return p1, p2, z1.detach(), z2.detach()
